"""Without a broker: the uplink checks of edgefl.wire.validate (declared arrays, groups that come
whole, routing read without the tensors) and broker URLs and topics."""

import numpy as np
import pytest

from edgefl.errors import WireError
from edgefl.transport.mqtt import BrokerAddress, Topics
from edgefl.wire import ArraySpec, Envelope, Limits, Payload, encode
from edgefl.wire.schema import check_arrays
from edgefl.wire.validate import peek

F32 = np.dtype(np.float32)


def test_check_arrays_accepts_the_declared_arrays():
    expected = {
        "w/a": ArraySpec(F32, (2, 3)),
        "w/b": ArraySpec(F32, None),
        "p": ArraySpec(F32, (None, 4)),
    }
    check_arrays(
        {
            "w/a": np.zeros((2, 3), np.float32),
            "w/b": np.zeros(7, np.float32),
            "p": np.zeros((9, 4), np.float32),
        },
        expected,
    )
    check_arrays({"anything": np.zeros(1, np.float32)}, None)  # no declaration: no check


@pytest.mark.parametrize(
    ("arrays", "reason"),
    [
        ({"w/a": np.zeros((3, 2), np.float32), "w/b": np.zeros(1, np.float32)}, "shape"),
        ({"w/a": np.zeros((2, 3), np.float64), "w/b": np.zeros(1, np.float32)}, "dtype float64"),
        ({"w/b": np.zeros(1, np.float32)}, "missing array 'w/a'"),
        (
            {
                "w/a": np.zeros((2, 3), np.float32),
                "w/b": np.zeros(1, np.float32),
                "sl/x": np.zeros(1, np.float32),
            },
            "undeclared array",
        ),
    ],
)
def test_check_arrays_rejects_wrong_dtypes_shapes_missing_and_extra_arrays(arrays, reason):
    with pytest.raises(WireError, match=reason):
        check_arrays(arrays, {"w/a": ArraySpec(F32, (2, 3)), "w/b": ArraySpec(F32, None)})


def test_an_empty_declaration_means_no_arrays():
    check_arrays({}, {})
    with pytest.raises(WireError, match="undeclared"):
        check_arrays({"w/x": np.zeros(1, np.float32)}, {})


def test_a_group_of_arrays_arrives_whole_or_not_at_all():
    # Prepare: "k" always; "r/x" and "r/k" together, or neither
    expected = {
        "k": ArraySpec(F32, (2,)),
        "r/x": ArraySpec(F32, None, "r"),
        "r/k": ArraySpec(F32, (1,), "r"),
    }
    k, x, kk = np.zeros(2, np.float32), np.zeros(5, np.float32), np.zeros(1, np.float32)
    # Execute / Assert
    check_arrays({"k": k}, expected)
    check_arrays({"k": k, "r/x": x, "r/k": kk}, expected)
    with pytest.raises(WireError, match="missing array 'r/k' of group 'r'"):
        check_arrays({"k": k, "r/x": x}, expected)
    with pytest.raises(WireError, match="missing array 'k'"):
        check_arrays({"r/x": x, "r/k": kk}, expected)


def test_peek_reads_routing_without_tensors_and_refuses_junk():
    env = Envelope(
        "update",
        4,
        "d01",
        fleet="f",
        payload=Payload({"w/x": np.ones(3, np.float32)}, {"ack": "m1", "num_samples": 3}),
    )
    r = peek(encode(env))
    assert (r.kind, r.round, r.device_id, r.fleet, r.message_id, r.meta["ack"]) == (
        "update",
        4,
        "d01",
        "f",
        env.message_id,
        "m1",
    )
    with pytest.raises(WireError, match="out of bounds|too short"):
        peek(b"\xff" * 64)
    with pytest.raises(WireError, match="exceeds the limit"):
        peek(encode(env), Limits(max_bytes=100))


def test_broker_url_parsing():
    a = BrokerAddress.parse("mqtts://pi-07:s3cret@broker.lan?ca=/etc/ca.crt&protocol=5")
    assert (a.host, a.port, a.username, a.password, a.tls, a.ca_file, a.protocol) == (
        "broker.lan",
        8883,
        "pi-07",
        "s3cret",
        True,
        "/etc/ca.crt",
        "5",
    )
    assert BrokerAddress.parse("127.0.0.1:1999").port == 1999
    assert Topics("lab").device("d1", "up") == "edgefl/lab/devices/d1/up"
    assert Topics("lab").parse_device("edgefl/lab/devices/d1/register") == ("d1", "register")
    assert Topics("lab").parse_device("edgefl/other/devices/d1/up") is None


# --- the verdict encode() remembers is the one a fresh check gives -------------------------------

_KINDS_META = [
    ("train", {}),
    ("update", {"num_samples": 12, "train_loss": 0.25, "tag": "x", "flag": True}),
    ("metrics", {"accuracy": 0.5, "loss": 1e-7}),
    ("ack", {"closed": "train", "epoch": "e1"}),
    ("error", {"reason": "why \u00e9\n\"quoted\""}),
]


@pytest.mark.parametrize(("kind", "meta"), _KINDS_META)
@pytest.mark.parametrize("n_arrays", [0, 1, 3])
def test_the_header_check_encode_remembers_is_what_a_fresh_check_gives(kind, meta, n_arrays):
    import struct

    from edgefl.wire import envelope

    arrays = {f"w/{i}": np.zeros((i + 1, 2), np.float32) for i in range(n_arrays)}
    if n_arrays:
        arrays["scalar"] = np.array(3, np.int64)  # a 0-d array: its shape is an empty list
    data = encode(Envelope(kind, 7, "d01", fleet="f", algorithm="fedavg", tier="2",
                           payload=Payload(arrays, dict(meta)), run="r0", nonce="ab12"))
    (n,) = struct.unpack("<Q", data[:8])
    raw = data[8 : 8 + n]
    remembered = envelope._CHECKED.entries[raw]
    fresh = envelope._check_header(raw, Limits())
    assert remembered[0] == fresh[0] and remembered[2:5] == fresh[2:5]
    # where the checksum starts: encode's CRC of the routing fields, the fields of a fresh check
    assert remembered[5] == envelope._routing_crc(fresh[5])
    assert [(k, type(v), v) for k, v in remembered[1].items()] == [
        (k, type(v), v) for k, v in fresh[1].items()
    ]


def test_a_remembered_header_is_held_to_each_readers_limits():
    data = encode(Envelope("update", 1, "d01", fleet="f", algorithm="fedavg",
                           payload=Payload({f"w{i}": np.zeros(2, np.float32) for i in range(5)},
                                           {"num_samples": 3})))
    peek(data)  # remembered (by encode, and by this look)
    with pytest.raises(WireError, match="5 tensors exceed the limit of 4"):
        peek(data, Limits(max_tensors=4))
    with pytest.raises(WireError, match="header nests 3 deep"):
        peek(data, Limits(max_depth=2))
    assert peek(data).kind == "update"


def test_the_crc_is_zlibs_whichever_library_computes_it():
    """zlib-ng's CRC-32 where it installs, zlib's elsewhere: a fleet may mix both."""
    import zlib

    from edgefl.wire.crc import crc32

    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 4096, 1 << 20):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert crc32(data) == zlib.crc32(data)
        assert crc32(data, 0x1234ABCD) == zlib.crc32(data, 0x1234ABCD)
        assert crc32(memoryview(data)[1:]) == zlib.crc32(data[1:])


def _retouched(data: bytes, fn, tail: bytes | None = None) -> bytes:
    """``data`` with its header changed by ``fn`` (the checksum left as it was) and its body
    replaced by ``tail`` if given."""
    import json
    import struct

    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    fn(header)
    raw = json.dumps(header).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    return struct.pack("<Q", len(raw)) + raw + (data[8 + n :] if tail is None else tail)


@pytest.mark.parametrize(
    "change",
    [
        lambda h: h["a"].update(shape=[3]),  # the bytes of 2 floats for 3
        lambda h: h["a"].update(shape=[2.0]),
        lambda h: h["a"].update(shape=[True, 2]),
        lambda h: h["a"].update(shape=[-2]),
        lambda h: h["a"].update(shape="2"),
        lambda h: h["a"].update(data_offsets=[0, 8, 8]),
        lambda h: h["a"].update(data_offsets=[0.0, 8]),
        lambda h: h["a"].update(data_offsets=[-8, 0]),
        lambda h: h["b"].update(data_offsets=[0, 8]),  # overlaps a
        lambda h: h["b"].update(data_offsets=[12, 20]),  # a gap, and past the end
        lambda h: h["a"].update(data_offsets=[8, 0]),
        lambda h: h["a"].pop("dtype"),
        lambda h: h["a"].pop("data_offsets"),
        lambda h: h["a"].update(dtype="F8_E4M3"),  # the library's, not ours
        lambda h: h["a"].update(dtype="complex"),
        lambda h: h["a"].update(dtype=7),
        lambda h: h.update(a=[0, 8]),
        lambda h: h.update(c={"dtype": "F32", "shape": [1], "data_offsets": [16, 20]}),
    ],
)
def test_decode_refuses_every_layout_the_safetensors_library_refuses(change):
    """decode reads the tensors itself (views, no copy): at least as strict as the library."""
    import safetensors

    from edgefl.wire import decode

    two = encode(Envelope("update", 1, "d01", fleet="f", algorithm="fedavg",
                          payload=Payload({"a": np.ones(2, np.float32),
                                           "b": np.ones(2, np.float32)}, {"num_samples": 3})))
    bad = _retouched(two, change)
    with pytest.raises(Exception):  # noqa: B017, PT011 - any refusal of the library's own types
        safetensors.deserialize(bad)
    with pytest.raises(WireError):
        decode(bad)


def test_decode_refuses_short_and_long_bodies_and_a_header_not_in_utf8():
    import safetensors

    from edgefl.wire import decode

    data = encode(Envelope("update", 1, "d01", fleet="f", algorithm="fedavg",
                           payload=Payload({"a": np.ones(2, np.float32)}, {"num_samples": 3})))
    for bad in (data[:-1], data + b"\0", data + b"\0" * 8):
        with pytest.raises(Exception):  # noqa: B017, PT011
            safetensors.deserialize(bad)
        with pytest.raises(WireError, match="malformed tensors"):
            decode(bad)
    import json
    import struct

    (n,) = struct.unpack("<Q", data[:8])
    wide = json.dumps(json.loads(data[8 : 8 + n])).encode("utf-16-le")
    utf16 = struct.pack("<Q", len(wide)) + wide + data[8 + n :]
    marked = b"\xef\xbb\xbf" + data[8 : 8 + n]
    for bad in (utf16, struct.pack("<Q", len(marked)) + marked + data[8 + n :]):
        with pytest.raises(Exception):  # noqa: B017, PT011
            safetensors.deserialize(bad)
        with pytest.raises(WireError, match="malformed tensors"):
            decode(bad)
    # an empty array and a 0-d one read as the library reads them
    odd = encode(Envelope("update", 1, "d01", fleet="f", algorithm="fedavg",
                          payload=Payload({"e": np.zeros((0, 3), np.float16),
                                           "s": np.array(2.5), "m": np.array([True, False])},
                                          {"num_samples": 3})))
    got = decode(odd).payload.arrays
    theirs = dict(safetensors.deserialize(odd))
    for name, a in got.items():
        assert a.shape == tuple(theirs[name]["shape"]) and not a.flags.writeable
        assert a.tobytes() == bytes(theirs[name]["data"])


def test_encode_lays_out_the_message_as_the_safetensors_library_does():
    """encode writes the layout itself (one copy of the tensors' bytes): the library's
    serialization of the same arrays and fields has the same header, as JSON, and the same body."""
    import json
    import struct

    import safetensors

    from edgefl.wire.envelope import _prepare
    from edgefl.wire.layout import DTYPES

    # every whitelisted dtype (each written in the library's order), a 0-d and an empty array
    arrays = {f"t{i}": np.arange(6).astype(dtype).reshape(2, 3) for i, dtype in enumerate(DTYPES)}
    arrays.update(scalar=np.array(2.5), empty=np.zeros((0, 3), np.float16))
    env = Envelope("update", 1, "d01", fleet="f", algorithm="fedavg",
                   payload=Payload(arrays, {"num_samples": 3}))
    ours = encode(env)
    _, routing, _, _, _ = _prepare(env)
    specs = {n: safetensors.TensorSpec(dtype=a.dtype.name, shape=a.shape, data_ptr=a.ctypes.data,
                                       data_len=a.nbytes) for n, a in arrays.items()}
    theirs = safetensors.serialize(specs, metadata=routing)
    (n,) = struct.unpack_from("<Q", ours)
    (m,) = struct.unpack_from("<Q", theirs)
    assert n == m and n % 8 == 0 and ours[8 + n :] == theirs[8 + m :]
    assert json.loads(ours[8 : 8 + n]) == json.loads(theirs[8 : 8 + m])
    with pytest.raises(WireError, match="__metadata__"):
        encode(Envelope("update", 1, "d01", payload=Payload(
            {"__metadata__": np.zeros(1, np.float32)}, {"num_samples": 3})))


def test_a_tensor_that_lies_unaligned_in_the_message_is_read_aligned():
    """Another writer may put a 3-byte tensor before a float32 one (a valid layout): decode's
    views would then be unaligned, so that tensor is copied."""
    import json
    import struct

    from edgefl.wire import decode
    from edgefl.wire.envelope import _checksum, _prepare

    arrays = {"a": np.arange(3, dtype=np.uint8), "b": np.arange(2, dtype=np.float32)}
    env = Envelope("update", 1, "d01", fleet="f", algorithm="fedavg",
                   payload=Payload(arrays, {"num_samples": 3}))
    _, routing, tensors, _, _ = _prepare(env)
    routing["checksum"] = _checksum({k: v for k, v in routing.items() if k != "checksum"},
                                    tensors)
    header = {"__metadata__": routing,
              "a": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]},
              "b": {"dtype": "F32", "shape": [2], "data_offsets": [3, 11]}}
    raw = json.dumps(header).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    data = struct.pack("<Q", len(raw)) + raw + arrays["a"].tobytes() + arrays["b"].tobytes()
    got = decode(data).payload.arrays
    assert got["b"].flags.aligned and not got["b"].flags.writeable
    assert np.array_equal(got["a"], arrays["a"]) and np.array_equal(got["b"], arrays["b"])
