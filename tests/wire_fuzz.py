"""The wire's fuzz harness: real captured messages of every method, mutated as an attacker who
can recompute the checksum would, fed through the receivers' own decode and check paths.

Used by ``tests/test_fuzz.py`` (a few thousand cases in CI) and ``benchmarks/fuzz/run.py``
(≥ 100,000). Outcomes per case: ``rejected`` (a WireError), ``accepted`` (and then an
independent oracle, written apart from the pydantic schema, re-checks that the accepted message
satisfies the schema: a ``violation`` if not), or ``exception`` (anything else escaped: a bug).

The writer here hand-builds the safetensors layout on purpose: it must write what the library
refuses to (non-string metadata, wrong byte counts), as an attacker's tool would.
"""

from __future__ import annotations

import inspect
import json
import math
import random
import struct
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgefl.errors import WireError
from edgefl.wire import Envelope, Payload, decode, encode
from edgefl.wire.envelope import _DTYPES, _checksum
from tests.wire_oracles import _down_oracle, _up_oracle

TAGS = {v: k for k, v in _DTYPES.items()}


@dataclass
class Case:
    """One captured message and the receiver's check for it: ``check(bytes)`` returns the
    accepted envelope or raises WireError."""

    method: str
    direction: str  # "up" (device → server) or "down"
    kind: str
    data: bytes
    check: Callable[[bytes], Envelope]
    oracle: Callable[[Envelope], str | None]  # None when the accepted message meets the schema


# --- capture ---------------------------------------------------------------------------------


def capture(methods: list[str], workdir: Path | None = None) -> list[Case]:
    """Run each method for two rounds in memory and keep one message of each (direction, kind)
    with the exact check its receiver applied."""
    from edgefl.runtime import simulation
    from edgefl.transport.memory import InMemoryTransport
    from tests.conftest import tiny_config

    cases: list[Case] = []
    original = InMemoryTransport.request

    for method in methods:
        seen: set[tuple[str, str]] = set()
        agents = {}

        def request(
            self, messages, *, timeout=None, accept, _seen=seen, _method=method, _agents=agents
        ):
            # in memory the envelopes travel as objects: fuzz their encodings, checked as a wire
            # transport checks them (decode, then the receiver's own check)
            out = original(self, messages, timeout=timeout, accept=accept)
            for device_id, down in messages.items():
                agent = inspect.unwrap(self.handlers[device_id]).__self__  # heap.fleet_heap wraps
                data = encode(down)
                if ("down", down.kind) not in _seen:
                    _seen.add(("down", down.kind))
                    cases.append(
                        Case(
                            _method,
                            "down",
                            down.kind,
                            data,
                            _device_check(agent),
                            _down_oracle(agent),
                        )
                    )
                d = out[device_id]
                replies = [encode(d.reply)] if d.reply is not None and d.value is not None else []
                if down.kind == "train":  # the error reply a device sends when it cannot train
                    replies.append(
                        encode(
                            down.reply(
                                "error",
                                Payload({}, {"reason": "out of memory"}),
                                algorithm=agent.algorithm,
                            )
                        )
                    )
                for reply in replies:
                    kind = decode(reply).kind
                    if ("up", kind) not in _seen:
                        _seen.add(("up", kind))
                        cases.append(
                            Case(
                                _method,
                                "up",
                                kind,
                                reply,
                                lambda b, a=accept, i=device_id: a(i, decode(b)),
                                _up_oracle(accept, device_id),
                            )
                        )
            return out

        InMemoryTransport.request = request
        try:
            with tempfile.TemporaryDirectory(dir=workdir) as tmp:
                simulation.simulate(tiny_config(Path(tmp), algorithm=method, rounds=1, clients=2))
        finally:
            InMemoryTransport.request = original
    return cases


def _device_check(agent) -> Callable[[bytes], Envelope]:
    def check(data: bytes) -> Envelope:
        env = decode(data, agent.limits)
        agent._check_request(env)
        return env

    return check


# --- the oracle: the schema restated in plain Python -------------------------------------------


# --- mutation --------------------------------------------------------------------------------

NASTY_JSON = [
    None,
    True,
    False,
    0,
    -1,
    1,
    2**63,
    -(2**70),
    1e308,
    -1e308,
    1.5,
    "",
    "x" * 70,
    "../../etc",
    "a/b",
    "ünïcode",
    "nan",
    "NaN",
    "inf",
    "-1",
    "1e3",
    "0x10",
    " 1",
    [],
    [1],
    {},
    {"a": 1},
    [[[]]],
    "fedavg",
    "*",
    "\u0000",
    "\ud800",
]
NASTY_NUMBERS = [
    float("nan"),
    float("inf"),
    -float("inf"),
    1e308,
    -1e308,
    1e300,
    3.5e38,
    0,
    -1,
    10**12,
    10**13,
    2**63,
    -0.0,
    0.5,
    1e-320,
]


def _header(data: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def _tensors_of(header: dict, body: bytes) -> dict[str, tuple[str, list, bytes]]:
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        out[name] = (info["dtype"], list(info["shape"]), body[a:b])
    return out


def write(
    routing: Any,
    tensors: dict[str, tuple[Any, Any, bytes]],
    *,
    fix_checksum: bool = True,
    pad: bool = True,
) -> bytes:
    """The attacker's writer: any routing values, any dtype/shape claims, checksum recomputed."""
    if fix_checksum and isinstance(routing, dict):
        try:
            items = [
                (n, str(t), tuple(s) if isinstance(s, list) else (), raw)
                for n, (t, s, raw) in sorted(tensors.items())
            ]
            routing = {**routing, "checksum": _checksum(routing, items)}
        except (TypeError, ValueError):
            pass
    header: dict[str, Any] = {"__metadata__": routing}
    body, offset = [], 0
    for name, (tag, shape, raw) in tensors.items():
        header[name] = {"dtype": tag, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        body.append(raw)
        offset += len(raw)
    raw_header = json.dumps(header).encode()
    if pad:
        raw_header += b" " * (-len(raw_header) % 8)
    return struct.pack("<Q", len(raw_header)) + raw_header + b"".join(body)


def mutate(data: bytes, r: random.Random, corpus: list[bytes]) -> tuple[str, bytes]:
    """One mutation of a captured message; returns (operator name, bytes)."""
    header, body = _header(data)
    routing = dict(header["__metadata__"])
    tensors = _tensors_of(header, body)
    meta = json.loads(routing["meta"])
    op = r.choice(OPERATORS)
    if op == "flip_bytes":
        b = bytearray(data)
        for _ in range(r.randint(1, 8)):
            b[r.randrange(len(b))] = r.randrange(256)
        return op, bytes(b)
    if op == "truncate":
        return op, data[: r.randrange(len(data))]
    if op == "routing_value":
        routing[r.choice(sorted(routing))] = r.choice(NASTY_JSON)
    elif op == "routing_drop":
        routing.pop(r.choice(sorted(routing)))
    elif op == "routing_add":
        routing[r.choice(["extra", "digest", "__proto__", "x" * 100])] = r.choice(["1", "", "x"])
    elif op == "relabel":  # a replay: same body, current-looking labels
        field_ = r.choice(["round", "nonce", "run", "algorithm", "kind", "device", "tier"])
        routing[field_] = r.choice({
            "round": ["0", "1", "2", "999999999", "1000000000"],
            "nonce": ["", "0" * 32, "f" * 32, "x" * 65],
            "run": ["", "other-run", "0" * 12],
            "algorithm": ["fedavg", "felo", "fedproto", "local", "", "FedAvg"],
            "kind": ["update", "metrics", "done", "error", "train", "ack", "register"],
            "device": ["d00", "d01", "d02", "*", "mallory"],
            "tier": ["1", "2", "3", "1/8", "resnet10", ""],
        }[field_])
    elif op == "meta_value":
        key = r.choice(
            sorted(meta) + ["num_samples", "accuracy", "train_loss", "reason", "split", "new"]
        )
        meta[key] = r.choice(NASTY_JSON + NASTY_NUMBERS)
        routing["meta"] = json.dumps(meta)
    elif op == "meta_drop" and meta:
        meta.pop(r.choice(sorted(meta)))
        routing["meta"] = json.dumps(meta)
    elif op == "meta_raw":
        routing["meta"] = r.choice(
            [
                "",
                "[]",
                "null",
                "{",
                "[" * 5000,
                '{"a": ' * 3 + "1" + "}" * 3,
                "NaN",
                '{"num_samples": 1e999}',
                "{}" * 3,
            ]
        )
    elif op == "dtype_swap" and tensors:
        name = r.choice(sorted(tensors))
        tag, shape, raw = tensors[name]
        new = r.choice(
            ["F64", "F16", "F32", "I64", "I32", "U8", "BOOL", "F8_E4M3", "BF16", ["F32"], None, 5]
        )
        if isinstance(new, str) and new in TAGS:
            count = math.prod(shape) if isinstance(shape, list) else 0
            fill = r.choice([0.0, 1.0, 1e300, -1e300, 3e38, 255, 2])
            try:
                raw = np.full(count, fill).astype(TAGS[new]).tobytes()
            except (OverflowError, ValueError):
                raw = np.zeros(count, TAGS[new]).tobytes()
        tensors[name] = (new, shape, raw)
    elif op == "shape_change" and tensors:
        name = r.choice(sorted(tensors))
        tag, shape, raw = tensors[name]
        tensors[name] = (
            tag,
            r.choice(
                [
                    [],
                    [0],
                    list(reversed(shape)),
                    shape + [1],
                    [2**62, 2**62],
                    [-1],
                    ["3"],
                    None,
                    [1.5],
                ]
            ),
            raw,
        )
    elif op == "tensor_values" and tensors:
        name = r.choice(sorted(tensors))
        tag, shape, raw = tensors[name]
        if tag in TAGS and len(raw):
            a = np.frombuffer(raw, TAGS[tag]).copy()
            a[r.randrange(a.size)] = (
                np.array(r.choice(NASTY_NUMBERS)).astype(a.dtype)
                if a.dtype.kind == "f"
                else r.randrange(256)
            )
            tensors[name] = (tag, shape, a.tobytes())
    elif op == "tensor_drop" and tensors:
        tensors.pop(r.choice(sorted(tensors)))
    elif op == "tensor_add":
        tensors[r.choice(["extra", "w/extra", "__metadata__x", "logit"])] = (
            "F32",
            [2],
            np.zeros(2, np.float32).tobytes(),
        )
    elif op == "replay_other":
        other_header, other_body = _header(r.choice(corpus))
        tensors = _tensors_of(other_header, other_body)
    elif op == "deep_header":
        depth = r.choice([5, 50, 2000, 100_000])
        return op, write(routing, tensors, fix_checksum=False)[:8] + b"[" * depth
    return op, write(routing, tensors, fix_checksum=r.random() < 0.95)


OPERATORS = [
    "flip_bytes",
    "truncate",
    "routing_value",
    "routing_drop",
    "routing_add",
    "relabel",
    "meta_value",
    "meta_drop",
    "meta_raw",
    "dtype_swap",
    "shape_change",
    "tensor_values",
    "tensor_drop",
    "tensor_add",
    "replay_other",
    "deep_header",
]


@dataclass
class Tally:
    cases: int = 0
    outcomes: Counter = field(default_factory=Counter)  # (method, direction, kind, outcome) → count
    operators: Counter = field(default_factory=Counter)  # (operator, outcome) → count
    problems: list[str] = field(default_factory=list)  # first few exceptions and violations

    def count(self, outcome: str) -> int:
        return sum(n for (*_, o), n in self.outcomes.items() if o == outcome)


def outcome(
    check: Callable[[bytes], Any],
    oracle: Callable[[Any], str | None],
    data: bytes,
    label: str,
    problems: list[str],
) -> str:
    """What one mutated message came to: ``rejected`` (a WireError), ``exception`` (anything
    else raised), ``violation`` (accepted, but ``oracle`` names a problem) or ``accepted``; the
    first 20 problems are kept in ``problems``, prefixed with ``label``."""
    try:
        value = check(data)
    except WireError:
        return "rejected"
    except Exception as e:  # noqa: BLE001 - what the harness is looking for
        if len(problems) < 20:
            problems.append(f"{label}: {type(e).__name__}: {e}"[:300])
        return "exception"
    problem = oracle(value)
    if problem and len(problems) < 20:
        problems.append(f"{label}: accepted but {problem}")
    return "violation" if problem else "accepted"


def run_case(case: Case, data: bytes, op: str, tally: Tally) -> None:
    tally.cases += 1
    label = f"{case.method} {case.direction} {case.kind} {op}"
    result = outcome(case.check, case.oracle, data, label, tally.problems)
    tally.outcomes[(case.method, case.direction, case.kind, result)] += 1
    tally.operators[(op, result)] += 1


def fuzz(cases: list[Case], n: int, seed: int = 0) -> Tally:
    """``n`` mutations, spread evenly over the cases (every kind of every method)."""
    r = random.Random(seed)
    corpus = [c.data for c in cases]
    tally = Tally()
    for i in range(n):
        case = cases[i % len(cases)]
        with np.errstate(all="ignore"):  # the mutator casts 1e300 into float16 on purpose
            op, data = mutate(case.data, r, corpus)
        run_case(case, data, op, tally)
    return tally

