"""The envelope: round trip, validation of everything that can be wrong on the wire."""

import json
import struct

import numpy as np
import pytest

from edgefl.errors import WireError
from edgefl.wire import Envelope, Limits, Payload, decode, encode


def _env(**arrays):
    payload = Payload(arrays or {"w/a": np.arange(6, dtype=np.float32).reshape(2, 3)}, {"num_samples": 12, "tag": "x"})
    return Envelope(kind="update", round=3, device_id="d01", fleet="f", algorithm="fedavg", tier="2", payload=payload)


def _tamper_header(data: bytes, fn) -> bytes:
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    fn(header)
    raw = json.dumps(header).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    return struct.pack("<Q", len(raw)) + raw + data[8 + n :]


def test_round_trip_keeps_arrays_meta_and_routing():
    env = _env(**{"w/a": np.random.default_rng(0).normal(size=(4, 5)).astype(np.float32), "k": np.arange(3)})
    back = decode(encode(env))
    assert (back.kind, back.round, back.device_id, back.fleet, back.algorithm, back.tier) == ("update", 3, "d01", "f", "fedavg", "2")
    assert back.message_id == env.message_id
    assert back.payload.meta == {"num_samples": 12, "tag": "x"}
    np.testing.assert_array_equal(back.payload.arrays["w/a"], env.payload.arrays["w/a"])
    assert back.payload.arrays["k"].dtype == np.int64


def test_empty_payload_round_trips():
    env = Envelope(kind="ack", round=0, device_id="d00")
    assert not decode(encode(env)).payload


def test_size_limit_is_enforced_before_parsing():
    data = encode(_env(**{"big": np.zeros(1000, np.float32)}))
    with pytest.raises(WireError, match="exceeds the limit"):
        decode(data, Limits(max_bytes=len(data) - 1))


def test_non_finite_values_are_rejected():
    with pytest.raises(WireError, match="non-finite"):
        decode(encode(_env(**{"w": np.array([1.0, np.nan], np.float32)})))


def test_unknown_kind_rejected_on_both_sides():
    with pytest.raises(WireError, match="unknown message kind"):
        encode(Envelope(kind="shell", round=0, device_id="d"))
    data = _tamper_header(encode(_env()), lambda h: h["__metadata__"].update(kind="shell"))
    with pytest.raises(WireError, match="unknown message kind"):
        decode(data)


def test_dtype_outside_whitelist_rejected():
    with pytest.raises(WireError, match="dtype"):
        encode(_env(**{"c": np.zeros(2, np.complex64)}))
    data = _tamper_header(encode(_env()), lambda h: h["w/a"].update(dtype="F8_E4M3"))
    with pytest.raises(WireError):
        decode(data)


def test_tampered_body_fails_the_digest():
    data = bytearray(encode(_env()))
    data[-1] ^= 0x01  # flip a bit of the last float
    with pytest.raises(WireError, match="digest"):
        decode(bytes(data))


@pytest.mark.parametrize(
    "blob",
    [b"", b"garbage", struct.pack("<Q", 10**9) + b"{}", struct.pack("<Q", 2) + b"[]", b"\x80\x04\x95" + b"\x00" * 40],
    ids=["empty", "short", "huge-header", "not-object", "pickle"],
)
def test_malformed_bytes_raise_wire_error(blob):
    with pytest.raises(WireError):
        decode(blob)


def test_shape_offset_mismatch_rejected():
    data = _tamper_header(encode(_env()), lambda h: h["w/a"].update(shape=[3, 3]))
    with pytest.raises(WireError, match="byte length"):
        decode(data)


def test_missing_routing_fields_rejected():
    data = _tamper_header(encode(_env()), lambda h: h["__metadata__"].pop("device"))
    with pytest.raises(WireError, match="routing"):
        decode(data)


def test_meta_values_must_be_scalars():
    env = Envelope(kind="update", round=0, device_id="d", payload=Payload({}, {"x": [1, 2]}))
    with pytest.raises(WireError, match="metadata"):
        encode(env)


def test_envelopes_are_plain_safetensors_both_ways():
    import safetensors.numpy

    arrays = {
        "w": np.random.default_rng(0).random((4, 5), dtype=np.float32),
        "ids": np.arange(7, dtype=np.int64),
        "scalar": np.array(2.5),
        "empty": np.zeros((0, 3), np.float16),
        "mask": np.array([True, False, True]),
    }
    data = encode(_env(**arrays))
    theirs = safetensors.numpy.load(data)  # the package reads what we write
    assert set(theirs) == set(arrays)
    # and we read what the package writes (with our header fields and digest)
    (n,) = struct.unpack("<Q", data[:8])
    metadata = json.loads(data[8 : 8 + n])["__metadata__"]
    ours = decode(safetensors.numpy.save(arrays, metadata=metadata)).payload.arrays
    for name, a in arrays.items():
        for got in (theirs[name], ours[name]):
            assert got.dtype == a.dtype and got.shape == a.shape and np.array_equal(got, a)


def test_tensor_byte_ranges_must_tile_the_body():
    two = _env(**{"a": np.ones(2, np.float32), "b": np.ones(2, np.float32)})
    overlap = _tamper_header(encode(two), lambda h: h["b"].update(data_offsets=[0, 8]))
    with pytest.raises(WireError, match="does not start where"):
        decode(overlap)
    data = encode(two)
    with pytest.raises(WireError, match="cover"):
        decode(data + b"\0" * 8)  # trailing bytes nobody accounts for
    flags = encode(_env(m=np.array([True, False])))
    bad = flags[:-1] + b"\x07"  # a BOOL byte that is neither 0 nor 1
    with pytest.raises(WireError, match="BOOL"):
        decode(bad)
