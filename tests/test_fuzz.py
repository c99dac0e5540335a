"""The quick fuzz run (CI): mutations of real captured messages of several methods, every
message kind they exchange, through the receivers' own checks; plus schema-built headers.

The long run (≥ 100,000 cases, every method) is ``benchmarks/fuzz/run.py``.
"""

import json
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgefl.errors import WireError
from edgefl.wire import decode
from tests import wire_fuzz, wire_oracles

# weights and knowledge (prototypes); the long run covers every method
METHODS = ["fedavg", "fedproto"]


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return wire_fuzz.capture(METHODS, tmp_path_factory.mktemp("capture"))


def test_capture_covers_every_kind_each_method_exchanges(cases):
    kinds = {(c.method, c.direction, c.kind) for c in cases}
    for m in METHODS:
        assert {(m, "down", k) for k in ("train", "evaluate", "finish")} <= kinds
        assert {(m, "up", k) for k in ("update", "metrics", "done", "error")} <= kinds
    for c in cases:  # unmutated, each passes its receiver's check and the oracle
        assert c.oracle(c.check(c.data)) is None


def test_mutations_are_rejected_with_wire_errors_or_meet_the_schema(cases):
    tally = wire_fuzz.fuzz(cases, 2000, seed=1)
    assert tally.cases == 2000
    assert tally.count("exception") == 0, tally.problems
    assert tally.count("violation") == 0, tally.problems
    # the harness reaches past the checksum: most structured mutations are refused by the schema
    assert tally.count("rejected") > 1000
    ops = {op for (op, outcome) in tally.operators if outcome == "rejected"}
    assert set(wire_fuzz.OPERATORS) <= ops


# --- headers built from the schema: valid-looking routing fields with hostile values mixed in ---

PATTERNS = {
    "fleet": r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}",
    "device": r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}",
    "round": r"0|[1-9][0-9]{0,8}",
    "message_id": r"[0-9a-f]{32}",
    "algorithm": r"[A-Za-z0-9_-]{0,64}",
    "tier": r"[A-Za-z0-9._/:-]{0,64}",
    "run": r"[A-Za-z0-9_-]{0,64}",
    "nonce": r"[A-Za-z0-9_-]{0,64}",
}
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
meta_values = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=30),
    json_values,
)


@st.composite
def headers(draw):
    routing = {
        k: draw(st.from_regex(p, fullmatch=True) | json_values)
        if draw(st.integers(0, 9)) == 0
        else draw(st.from_regex(p, fullmatch=True))
        for k, p in PATTERNS.items()
    }
    routing["schema"] = "2"
    routing["kind"] = draw(
        st.sampled_from(
            ["train", "update", "evaluate", "metrics", "finish", "done", "error", "ack", "shell"]
        )
    )
    meta = draw(
        st.dictionaries(
            st.sampled_from(
                ["num_samples", "accuracy", "train_loss", "loss", "reason", "split", "x"]
            ),
            meta_values,
            max_size=5,
        )
    )
    try:
        routing["meta"] = json.dumps(meta)
    except ValueError:
        routing["meta"] = "{}"
    tensors = {}
    for name in draw(st.lists(st.sampled_from(["w/a", "proto", "count"]), max_size=2, unique=True)):
        tag = draw(st.sampled_from(["F32", "F64", "I64", "U8", "BOOL", "F16", "BF16"]))
        shape = draw(st.lists(st.integers(0, 3), max_size=2))
        size = {"F32": 4, "F64": 8, "I64": 8, "U8": 1, "BOOL": 1, "F16": 2, "BF16": 2}[tag]
        count = 1
        for s in shape:
            count *= s
        tensors[name] = (tag, shape, draw(st.binary(min_size=count * size, max_size=count * size)))
    return wire_fuzz.write(routing, tensors, fix_checksum=draw(st.booleans()))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(headers())
def test_schema_built_envelopes_decode_into_schema_valid_messages_or_raise_wire_error(data):
    try:
        env = decode(data)
    except WireError:
        return
    assert wire_oracles._routing_problem(env) is None
    (n,) = struct.unpack("<Q", data[:8])
    assert env.payload.meta == json.loads(json.loads(data[8 : 8 + n])["__metadata__"]["meta"])


# --- everything else a device sends (issue 36)
# -------------------------------------------------------


def test_device_messages_of_every_kind_are_refused_with_wire_errors_or_meet_their_schema(tmp_path):
    import logging

    from tests import device_fuzz

    kinds = device_fuzz.kinds(tmp_path)
    for kind in kinds:  # unmutated, each seed passes its receiver and the oracle
        for seed in kind.seeds:
            kind.prepare()
            assert kind.oracle(kind.check(seed)) is None, kind.name
    logging.disable(logging.CRITICAL)
    try:
        tally = device_fuzz.fuzz(kinds, 3000, seed=2)
    finally:
        logging.disable(logging.NOTSET)
    assert tally.cases == 3000
    assert tally.count("exception") == 0, tally.problems
    assert tally.count("violation") == 0, tally.problems
    for kind in device_fuzz.KINDS:  # every kind is both refused and accepted somewhere
        assert tally.outcomes[(kind, "rejected")] > 0 and tally.outcomes[(kind, "accepted")] > 0, (
            kind
        )
    assert set(tally.worst) == set(device_fuzz.KINDS)
