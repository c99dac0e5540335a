"""The envelope: round trip, validation of everything that can be wrong on the wire."""

import dataclasses
import json
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgefl.errors import WireError
from edgefl.wire import Envelope, Limits, Payload, check, decode, encode, encoded_size


def _env(**arrays):
    payload = Payload(
        arrays or {"w/a": np.arange(6, dtype=np.float32).reshape(2, 3)},
        {"num_samples": 12, "tag": "x"},
    )
    return Envelope(
        kind="update",
        round=3,
        device_id="d01",
        fleet="f",
        algorithm="fedavg",
        tier="2",
        payload=payload,
    )


def _tamper_header(data: bytes, fn) -> bytes:
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    fn(header)
    raw = json.dumps(header).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    return struct.pack("<Q", len(raw)) + raw + data[8 + n :]


def test_round_trip_keeps_arrays_meta_and_routing():
    env = _env(
        **{
            "w/a": np.random.default_rng(0).normal(size=(4, 5)).astype(np.float32),
            "k": np.arange(3),
        }
    )
    back = decode(encode(env))
    assert (back.kind, back.round, back.device_id, back.fleet, back.algorithm, back.tier) == (
        "update",
        3,
        "d01",
        "f",
        "fedavg",
        "2",
    )
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
    with pytest.raises(WireError, match="header: kind"):
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
    with pytest.raises(WireError, match="checksum"):
        decode(bytes(data))


def test_checksum_covers_the_routing_fields():
    data = _tamper_header(encode(_env()), lambda h: h["__metadata__"].update(round="4"))
    with pytest.raises(WireError, match="checksum"):
        decode(data)


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"garbage",
        struct.pack("<Q", 10**9) + b"{}",
        struct.pack("<Q", 2) + b"[]",
        b"\x80\x04\x95" + b"\x00" * 40,
    ],
    ids=["empty", "short", "huge-header", "not-object", "pickle"],
)
def test_malformed_bytes_raise_wire_error(blob):
    with pytest.raises(WireError):
        decode(blob)


def test_shape_offset_mismatch_rejected():
    data = _tamper_header(encode(_env()), lambda h: h["w/a"].update(shape=[3, 3]))
    with pytest.raises(WireError, match="malformed tensors"):
        decode(data)


def test_missing_routing_fields_rejected():
    data = _tamper_header(encode(_env()), lambda h: h["__metadata__"].pop("device"))
    with pytest.raises(WireError, match="device: Field required"):
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
    with pytest.raises(WireError, match="malformed tensors"):
        decode(overlap)
    data = encode(two)
    with pytest.raises(WireError, match="malformed tensors"):
        decode(data + b"\0" * 8)  # trailing bytes nobody accounts for
    flags = encode(_env(m=np.array([True, False])))
    bad = flags[:-1] + b"\x07"  # a BOOL byte that is neither 0 nor 1
    with pytest.raises(WireError, match="BOOL"):
        decode(bad)


# --- the schema: routing fields, metadata, depth (issue 19) ---------------------------------------


def test_a_deeply_nested_header_is_refused_by_the_parser_itself():
    deep = b"[" * 100_000 + b"]" * 100_000
    data = struct.pack("<Q", len(deep)) + deep
    with pytest.raises(WireError, match="header nests deeper than the parser's recursion limit"):
        decode(data)
    # within the recursion limit: measured on the parsed value
    shallow_deep = b"[" * 500 + b"]" * 500
    with pytest.raises(WireError, match="header nests 500 deep"):
        decode(struct.pack("<Q", len(shallow_deep)) + shallow_deep)


def test_nesting_is_measured_on_the_parsed_header_and_bounded():
    from edgefl.wire.jsontext import nesting

    assert [nesting(v) for v in (1, "[[", [], {"a": [1, {"b": []}]}, [[[[[]]]]])] == [0, 0, 1, 4, 5]
    header = json.dumps(
        {"t": {"dtype": "F32", "shape": [[1]], "data_offsets": [0, 4]}, "__metadata__": {}}
    ).encode()
    data = struct.pack("<Q", len(header)) + header
    with pytest.raises(WireError, match="header nests 4 deep"):  # the limit is 3 levels
        decode(data, Limits(max_depth=3))


def test_a_header_is_checked_once_and_each_caller_gets_its_own_metadata():
    from edgefl.wire import envelope
    from edgefl.wire.validate import peek

    data = encode(_env())
    envelope._CHECKED.cache_clear()
    first = peek(data)
    first.meta["tag"] = "changed by one reader"
    again = peek(data)
    assert envelope._CHECKED.hits == 1  # the second look did not check it again
    assert again.meta == {"num_samples": 12, "tag": "x"} == decode(data).payload.meta
    bad = _tamper_header(data, lambda h: h["__metadata__"].update(round="-1"))
    for _ in range(2):  # a refused header is refused every time, never remembered
        with pytest.raises(WireError, match="round"):
            peek(bad)
    assert len(envelope._CHECKED.entries) == 1


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("round", "-1", "round"),
        ("round", "1e3", "round"),
        ("device", "../../etc", "device"),
        ("fleet", "x" * 200, "fleet"),
        ("algorithm", ["fedavg"], "algorithm"),
        ("nonce", 7, "nonce"),
        ("extra", "x", "extra"),
    ],
)
def test_routing_fields_are_typed_and_bounded(field, value, reason):
    data = _tamper_header(encode(_env()), lambda h: h["__metadata__"].update({field: value}))
    with pytest.raises(WireError, match=reason):
        decode(data)


@pytest.mark.parametrize(
    ("meta", "reason"),
    [
        ({"tag": "x"}, "num_samples: Field required"),
        ({"num_samples": "abc"}, "num_samples"),
        ({"num_samples": 0}, "num_samples"),
        ({"num_samples": 3, "train_loss": 1e308}, "train_loss"),
        ({"num_samples": 3, "train_loss": "nan"}, "train_loss"),
        ({"num_samples": 3, "other": {"nested": 1}}, "nests 2 deep"),
        ({"num_samples": True}, "num_samples"),
    ],
)
def test_update_metadata_is_typed_and_bounded(meta, reason):
    def swap(h):
        h["__metadata__"]["meta"] = json.dumps(meta)

    with pytest.raises(WireError, match=reason):
        decode(_tamper_header(encode(_env()), swap))


def test_metrics_accuracy_must_be_a_number_in_range():
    for bad in ("nan", 1.5, -0.1):
        env = Envelope("metrics", 0, "d00", payload=Payload({}, {"accuracy": 0.5}))
        data = _tamper_header(
            encode(env), lambda h, b=bad: h["__metadata__"].update(meta=json.dumps({"accuracy": b}))
        )
        with pytest.raises(WireError, match="accuracy"):
            decode(data)


def test_a_reply_must_echo_its_request_and_carry_the_declared_dtypes():
    from edgefl.wire import array_spec, new_nonce
    from edgefl.wire.schema import Expectation
    from edgefl.wire.validate import check_reply

    request = Envelope(
        "train", 2, "d01", fleet="f", algorithm="fedavg", tier="2", run="r1", nonce=new_nonce()
    )
    want = Expectation("train", 2, "d01", "f", "2", "r1", request.nonce, "fedavg",
                       arrays={"w/a": array_spec(np.float32, (2, 3))}, max_samples=20)
    good = request.reply(
        "update", Payload({"w/a": np.zeros((2, 3), np.float32)}, {"num_samples": 12})
    )
    check_reply(decode(encode(good)), want)
    bad = {
        "nonce": dataclasses.replace(good, nonce=new_nonce()),
        "round": dataclasses.replace(good, round=1),
        "run": dataclasses.replace(good, run="r0"),
        "algorithm": dataclasses.replace(good, algorithm="felo"),
        "dtype float64": dataclasses.replace(
            good, payload=Payload({"w/a": np.full((2, 3), 1e300)}, {"num_samples": 12})
        ),
        "claims 21 samples": dataclasses.replace(
            good, payload=Payload(good.payload.arrays, {"num_samples": 21})
        ),
    }
    for reason, reply in bad.items():
        with pytest.raises(WireError, match=reason):
            check_reply(decode(encode(reply)), want)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512))
def test_any_bytes_decode_or_raise_wire_error(blob):
    try:
        decode(blob)
    except WireError:
        pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_mutation_of_a_real_envelope_decodes_or_raises_wire_error(data):
    blob = bytearray(encode(_env(**{"w/a": np.ones((3, 4), np.float32), "n": np.arange(3)})))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(blob) - 1))
        blob[i] = data.draw(st.integers(0, 255))
    try:
        decode(bytes(blob))
    except WireError:
        pass


def test_a_device_answers_a_downlink_of_the_wrong_dtype_with_an_error_and_keeps_its_model(tmp_path):
    import torch

    from edgefl.algorithms import get_algorithm
    from edgefl.algorithms.base import DeviceContext, TrainSettings
    from edgefl.data import load_dataset
    from edgefl.models import ModelSpec
    from edgefl.runtime.agent import DeviceAgent

    data = load_dataset("synthetic", "train").subset(np.arange(40))
    spec = ModelSpec("cnn", "1", 10, data.info.in_shape, width=0.25)
    half = get_algorithm("fedavg").device(
        DeviceContext("d00", spec, data, TrainSettings(steps=1), 0, 1),
        get_algorithm("fedavg").parse_options({}),
    )
    agent = DeviceAgent(half, algorithm="fedavg", run_id="r1")
    before = {k: v.clone() for k, v in half.model.state_dict().items()}
    # float64, right shapes
    weights = {k: np.full(v.shape, 1e300) for k, v in half.expected_downlink().items()}
    request = Envelope(
        "train",
        0,
        "d00",
        algorithm="fedavg",
        tier="1",
        run="r1",
        nonce="ab" * 16,
        payload=Payload(weights),
    )
    reply = decode(agent.handle_bytes(encode(request)))
    assert (
        reply.kind == "error"
        and "dtype float64" in reply.payload.meta["reason"]
        and reply.nonce == request.nonce
    )
    assert all(torch.equal(before[k], v) for k, v in half.model.state_dict().items())
    other_run = dataclasses.replace(request, run="r0", payload=Payload())
    assert "run 'r0'" in decode(agent.handle_bytes(encode(other_run))).payload.meta["reason"]
    assert agent.handle_bytes(b"\x00" * 64) is None  # no readable routing: nobody to answer


# --- the in-memory path: check() and encoded_size() -----------------------------------------------

_DTYPES = [np.float32, np.float64, np.float16, np.int64, np.int32, np.uint8, np.bool_]


@st.composite
def _envelopes(draw):
    arrays = {}
    for _ in range(draw(st.integers(0, 6))):
        name = draw(st.text("abw/_.0123", min_size=1, max_size=12))
        shape = tuple(draw(st.lists(st.integers(0, 40), max_size=3)))
        arrays[name] = np.zeros(shape, draw(st.sampled_from(_DTYPES)))
    meta = {"num_samples": draw(st.integers(1, 10**6)),
            "x": draw(st.floats(-1e9, 1e9, allow_nan=False)),
            "s": draw(st.text(max_size=20))}
    return Envelope(
        "update",
        draw(st.integers(0, 10**6)),
        f"d{draw(st.integers(0, 999)):03d}",
        algorithm="fedavg",
        tier=str(draw(st.integers(1, 99))),
        payload=Payload(arrays, meta),
        run="r0",
        nonce=draw(st.text("abcdef0123456789", min_size=1, max_size=32)),
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_envelopes())
def test_encoded_size_is_the_encoding_length_and_check_gives_what_decode_gives(env):
    # safetensors orders tensors by dtype then name, and the offsets' digits change the header's
    # length
    assert encoded_size(env) == len(encode(env))
    got, want = check(env), decode(encode(env))
    assert got.payload.meta == want.payload.meta and got.payload.meta is not env.payload.meta
    assert set(got.payload.arrays) == set(want.payload.arrays)
    for k, a in want.payload.arrays.items():
        assert got.payload.arrays[k].dtype == a.dtype and got.payload.arrays[k].shape == a.shape


def test_check_keeps_every_routing_field_as_decode_does():
    # check() builds its envelope field by field: a field added to Envelope must be kept there too
    env = Envelope("update", 7, "d03", fleet="f1", algorithm="fedavg", tier="t/2",
                   payload=Payload({"w": np.ones(3, np.float32)}, {"num_samples": 4}),
                   run="r9", nonce="abc")
    got, want = check(env), decode(encode(env))
    for f in dataclasses.fields(Envelope):
        if f.name != "payload":
            assert getattr(got, f.name) == getattr(want, f.name) == getattr(env, f.name), f.name


def test_the_wire_json_writers_write_what_json_dumps_writes():
    from edgefl.wire import envelope

    values = [
        {"b": 1, "a": [1, 2.5, -0.0], "é": "ü\u2028\"\\\n", "n": None, "t": True, "x": 1e300},
        {"__metadata__": {"schema": "2", "meta": json.dumps({"s": "x\"y"})},
         "w/ä": {"dtype": "F32", "shape": [2, 0], "data_offsets": [0, 0]}},
        {},
    ]
    for value in values:
        assert envelope._CANONICAL(value) == json.dumps(value, sort_keys=True)
        assert envelope._META_JSON(value) == json.dumps(value, sort_keys=True, allow_nan=False)
        assert envelope._HEADER_JSON(value) == json.dumps(value, separators=(",", ":"),
                                                          ensure_ascii=False)
    with pytest.raises(ValueError):
        envelope._META_JSON({"x": float("nan")})
    assert envelope._META_JSON({"x": 1.5}) == '{"x": 1.5}'  # no state left by the failure


def test_empty_metadata_is_refused_each_time_by_the_kinds_that_require_a_field():
    from edgefl.wire.schema import check_meta

    for _ in range(2):  # the verdict on {} is remembered only where {} passes
        assert check_meta("train", {}) == {}
        for kind in ("update", "metrics", "error"):
            with pytest.raises(WireError, match=f"{kind} metadata"):
                check_meta(kind, {})
        with pytest.raises(WireError):
            check_meta("train", [])  # not a dict: never the remembered verdict
    env = Envelope("update", 0, "d0", payload=Payload({}, {}))
    with pytest.raises(WireError, match="update metadata"):
        check(env)


def test_message_ids_are_uuid4_hex():
    import uuid

    ids = {Envelope("train", 0, "d0").message_id for _ in range(200)}
    assert len(ids) == 200
    for i in ids:
        u = uuid.UUID(hex=i)
        assert u.hex == i and u.version == 4 and u.variant == uuid.RFC_4122


def test_check_hands_over_read_only_views_without_copying():
    weights = np.arange(1_000_000, dtype=np.float32)
    env = Envelope(
        "train", 0, "d00", algorithm="fedavg", payload=Payload({"w/x": weights}), run="r", nonce="n"
    )
    got = check(env).payload.arrays["w/x"]
    assert np.shares_memory(got, weights)  # no copy
    with pytest.raises(ValueError, match="read-only"):
        got[0] = 1.0  # the receiver cannot change the sender's state
    assert weights.flags.writeable  # the sender's own array is untouched


@pytest.mark.parametrize(
    ("arrays", "meta", "limits", "reason"),
    [
        ({"w": np.array([np.nan], np.float32)}, {}, Limits(), "non-finite"),
        ({"w": np.array([1.0], np.complex64)}, {}, Limits(), "dtype"),
        ({"w": np.zeros(100, np.float32)}, {}, Limits(max_bytes=300), "exceeds the limit"),
        (
            {f"w{i}": np.zeros(1, np.float32) for i in range(5)},
            {},
            Limits(max_tensors=4),
            "tensors exceed",
        ),
        ({}, {"split": "x" * 10_000}, Limits(), "metadata"),
    ],
)
def test_check_refuses_what_decode_refuses(arrays, meta, limits, reason):
    env = Envelope(
        "evaluate", 0, "d00", algorithm="fedavg", payload=Payload(arrays, meta), run="r", nonce="n"
    )
    with pytest.raises(WireError, match=reason):
        check(env, limits)
    try:
        data = encode(env)
    except WireError as e:  # refused already when encoding
        assert reason in str(e) or "dtype" in str(e) or "metadata" in str(e)
        return
    with pytest.raises(WireError, match=reason):
        decode(data, limits)
