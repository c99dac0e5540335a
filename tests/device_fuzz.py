"""The fuzz harness for everything else a device sends (issue 36): registrations, status words,
model reports, metrics replies, chunk headers and chunk acks, mutated as an attacker holding a
device's credentials would (checksums recomputed), fed through the receivers' own code: the
server's ``Registry.handle``, ``parse_status``, ``parse_active``, ``decode`` + ``check_reply``,
``Reassembler.add`` and ``ChunkSender.on_ack``.

Outcomes per case, as in :mod:`tests.wire_fuzz`: ``rejected`` (a WireError, or a registration the
registry refused and counted), ``accepted`` (then an oracle written apart from the schema checks
what was accepted), ``violation`` (accepted but out of schema) or ``exception`` (anything else
escaped). Each case is timed: the worst time per byte of each kind is reported.
"""

from __future__ import annotations

import json
import math
import random
import struct
import time
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgefl.errors import WireError
from edgefl.transport.chunks import (
    ACK,
    HEADER,
    MAGIC,
    ChunkSender,
    ChunkSettings,
    Reassembler,
    pack_ack,
    split,
)
from edgefl.wire import Envelope, Payload, decode, encode
from edgefl.wire.schema import Expectation
from edgefl.wire.validate import check_reply, parse_active, parse_status
from tests import wire_fuzz
from tests.wire_fuzz import NASTY_JSON, NASTY_NUMBERS, _finite_number, _header, _routing_problem

KINDS = ("register", "status", "active", "metrics", "chunk", "ack")
PROFILE = {
    "name": "d0",
    "arch": "aarch64",
    "cpu_model": "Cortex-A72",
    "cores": 4,
    "ram_total_mb": 3800,
    "ram_available_mb": 3000,
    "kind": "raspberry-pi",
    "board": "Raspberry Pi 4",
    "train_gflops": 1.5,
}
DEEP = [5, 50, 2000, 100_000, 4 * 1024 * 1024]


@dataclass
class Tally:
    cases: int = 0
    outcomes: Counter = field(default_factory=Counter)  # (kind, outcome) → count
    operators: Counter = field(default_factory=Counter)  # (kind, operator, outcome) → count
    problems: list[str] = field(default_factory=list)
    # kind → the worst seconds per byte and the slowest case, each re-timed best of 5
    worst: dict[str, dict[str, Any]] = field(default_factory=dict)

    def count(self, outcome: str) -> int:
        return sum(n for (_, o), n in self.outcomes.items() if o == outcome)


# --- the receivers
# ---------------------------------------------------------------------------------


class Receivers:
    """One of each receiver, reset to a known state before each case."""

    def __init__(self, tmp_path):
        from edgefl.data import dataset_info
        from edgefl.runtime.server import Registry, ServeOptions
        from edgefl.runtime.setup import model_spec
        from tests.conftest import tiny_config

        cfg = tiny_config(tmp_path)
        info = dataset_info(cfg.dataset)
        self.registry = Registry(
            cfg,
            lambda tier: model_spec(cfg, tier, info),
            "epoch1",
            0.0,
            ServeOptions(broker="mqtt://127.0.0.1:1"),
        )
        self.message = encode(
            Envelope(
                "update",
                1,
                "d0",
                payload=Payload({"w": np.arange(2000, dtype=np.float32)}, {"num_samples": 5}),
            )
        )
        self.chunks = split(self.message, b"\x05" * 16, 1000)
        self.max_bytes = 1 << 20
        self.chunk_settings = ChunkSettings(
            threshold=64, chunk_size=1000, max_chunk_size=4096, max_partial_bytes=64 * 1024
        )

    # each receiver's known state is set up by its prepare_*, outside the timed check

    def prepare_register(self) -> None:
        reg = self.registry
        reg.ready.clear(), reg.assigned.clear(), reg.profiles.clear(), reg.incarnations.clear()
        reg.handle(
            "d0",
            encode(
                Envelope(
                    "register",
                    0,
                    "d0",
                    payload=Payload(
                        {},
                        {
                            "profile": json.dumps(PROFILE),
                            "ready": True,
                            "num_samples": 500,
                            "incarnation": "base",
                        },
                    ),
                )
            ),
        )

    def register(self, data: bytes) -> Any:
        reg = self.registry
        before = reg.rejected
        answer = reg.handle("d0", data)
        if reg.rejected > before:
            raise WireError("refused and counted")
        if answer is None:
            raise WireError("ignored (another server's epoch)")
        return data

    def metrics(self, data: bytes) -> Envelope:
        env = decode(data)
        check_reply(env, METRICS_WANT)
        return env

    def prepare_chunk(self) -> None:
        self.reassembler = Reassembler(self.chunk_settings, max_bytes=self.max_bytes, timer=False)
        for c in self.chunks[:-1]:  # all but the last chunk of a real message are in
            self.reassembler.add("d0", c)

    def chunk(self, data: bytes) -> tuple[bytes, bytes | None]:
        message, _ = self.reassembler.add("d0", data)
        if self.reassembler.partial_bytes > self.chunk_settings.max_partial_bytes:
            raise AssertionError("reassembly over its budget")
        return data, message

    def prepare_ack(self) -> None:
        self.sender = ChunkSender(lambda topic, chunk: None, self.chunk_settings, timer=False)
        self.sender.send("d/down", self.message, b"\x05" * 16)

    def ack(self, data: bytes) -> bytes:
        self.sender.on_ack("d/down", data)
        return data


METRICS_WANT = Expectation("evaluate", 3, "d0", "lab", "2", "run1", "n" * 32, "fedavg")


# --- oracles: the schemas restated in plain Python
# ----------------------------------------------------

REGISTER_FIELDS = {"profile", "ready", "tier", "num_samples", "epoch", "incarnation"}


def register_oracle(data: bytes) -> str | None:
    header, _ = _header(data)
    meta = json.loads(header["__metadata__"]["meta"])
    if not set(meta) <= REGISTER_FIELDS:
        return "unknown registration field"
    profile = json.loads(meta.get("profile", "{}"))
    if not isinstance(profile, dict) or len(profile) > 32:
        return "profile not a bounded object"
    for k, v in profile.items():
        if isinstance(v, (dict, list)) or (isinstance(v, str) and len(v) > 1024) or len(k) > 64:
            return f"profile field {k[:20]} not a bounded scalar"
        if isinstance(v, float) and not math.isfinite(v):
            return "profile number not finite"
    ready = meta.get("ready", False)
    if not isinstance(ready, bool):
        return "ready not a bool"
    if ready:
        n = meta.get("num_samples")
        if not (isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 10**9):
            return "num_samples"
        inc = meta.get("incarnation") or ""
        if n != 500 and (not inc or inc == "base"):
            return "a declared size changed without a new registration epoch"
    return None


def status_oracle(word: str) -> str | None:
    return None if word in ("online", "offline") else "status word"


ACTIVE_FIELDS = {"version", "digest", "tier", "format", "previous", "time", "error"}


def active_oracle(report: dict) -> str | None:
    if not set(report) <= ACTIVE_FIELDS:
        return "unknown report field"
    for k in ("version", "tier", "error"):
        if k in report and not (
            isinstance(report[k], str) and len(report[k]) <= (4096 if k == "error" else 128)
        ):
            return k
    if "digest" in report and not (
        isinstance(report["digest"], str) and all(c in "0123456789abcdef" for c in report["digest"])
    ):
        return "digest"
    if report.get("format") not in (None, "fp32", "int8", ""):
        return "format"
    prev = report.get("previous", [])
    if not (
        isinstance(prev, list)
        and len(prev) <= 16
        and all(p is None or (isinstance(p, str) and len(p) <= 128) for p in prev)
    ):
        return "previous"
    if not _finite_number(report.get("time", 0.0), 0.0, 1e11):
        return "time"
    return None


def metrics_oracle(env: Envelope) -> str | None:
    problem = _routing_problem(env)
    if problem:
        return problem
    w = METRICS_WANT
    if (env.device_id, env.fleet, env.round, env.run, env.nonce, env.algorithm) != (
        w.device_id,
        w.fleet,
        w.round,
        w.run,
        w.nonce,
        w.algorithm,
    ):
        return "does not echo its request"
    if env.payload.arrays:
        return "arrays in a metrics reply"
    meta = env.payload.meta
    if env.kind == "error":
        return None if isinstance(meta.get("reason"), str) else "error without a reason"
    if env.kind != "metrics" or env.tier != w.tier:
        return "kind or tier"
    if not _finite_number(meta.get("accuracy"), 0.0, 1.0):
        return "accuracy"
    for k in ("loss", "samples"):
        if k in meta and not _finite_number(meta[k], 0.0):
            return k
    return None


def chunk_oracle(
    result: tuple[bytes, bytes | None], max_bytes: int = 1 << 20, max_chunk: int = 4096
) -> str | None:
    data, message = result
    if len(data) < HEADER.size:
        return "short chunk accepted"
    magic, _, index, count, total, size, crc, chunk_crc = HEADER.unpack_from(data)
    if magic != MAGIC or not (1 <= total <= max_bytes) or not (1 <= size <= max_chunk):
        return "header field out of range"
    if count != -(-total // size) or index >= count:
        return "count or index"
    body = data[HEADER.size:]
    if len(body) != min(total, (index + 1) * size) - index * size or zlib.crc32(body) != chunk_crc:
        return "body length or checksum"
    if message is not None and (len(message) != total or zlib.crc32(message) != crc):
        return "a reassembled message that does not match its header"
    return None


def ack_oracle(data: bytes) -> str | None:
    if len(data) != ACK.size:
        return "ack length"
    magic, mid, nxt, _, status = ACK.unpack(data)
    if not data.startswith(b"EFLCACK1") or status not in (0, 1, 2):
        return "ack magic or status"
    return None


# --- mutation
# ------------------------------------------------------------------------------------------


def _flip(data: bytes, r: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(r.randint(1, 8)):
        if b:
            b[r.randrange(len(b))] = r.randrange(256)
    return bytes(b)


def _rewrite_meta(data: bytes, meta: Any, fix: bool = True) -> bytes:
    header, _ = _header(data)
    routing = dict(header["__metadata__"])
    routing["meta"] = meta if isinstance(meta, str) else json.dumps(meta)
    return wire_fuzz.write(routing, {}, fix_checksum=fix)


def mutate_register(data: bytes, r: random.Random, corpus: list[bytes]) -> tuple[str, bytes]:
    op = r.choice(
        ["envelope", "envelope", "profile", "profile_field", "count", "token", "extra", "deep"]
    )
    if op == "envelope":
        name, out = wire_fuzz.mutate(data, r, corpus)
        return f"envelope:{name}", out
    header, _ = _header(data)
    meta = json.loads(header["__metadata__"]["meta"])
    if op == "profile":
        meta["profile"] = r.choice(
            [
                "[" * r.choice(DEEP[:4]),
                "{" * 3000,
                "",
                "null",
                "[]",
                "1e400",
                "x" * 20000,
                '{"a": {"b": 1}}',
                json.dumps({f"k{i}": i for i in range(r.choice([31, 32, 33, 100]))}),
                "NaN",
                '{"a": NaN}',
            ]
        )
    elif op == "profile_field":
        prof = dict(PROFILE)
        prof[r.choice([*PROFILE, "new", "x" * 70])] = r.choice(
            NASTY_JSON + NASTY_NUMBERS + ["y" * 1025]
        )
        try:
            meta["profile"] = json.dumps(prof)
        except ValueError:
            meta["profile"] = json.dumps(prof, allow_nan=True)
    elif op == "count":
        meta["ready"] = r.choice([True, True, False, 1, "true"])
        meta["num_samples"] = r.choice(
            [500, 501, 10**9, 10**9 + 1, 10**12, 0, -1, 1, 2.5, True, "500", None, 1e308]
        )
        if r.random() < 0.5:
            meta["incarnation"] = r.choice(["base", "new", "", "x" * 65, "bad chars!", None, 7])
    elif op == "token":
        meta[r.choice(["tier", "epoch", "incarnation"])] = r.choice(
            NASTY_JSON + ["epoch1", "2", "other"]
        )
    elif op == "extra":
        meta[r.choice(["extra", "num_samples2", "profile ", "__class__"])] = r.choice(
            [1, "x", True]
        )
    elif op == "deep":
        return op, struct.pack("<Q", 1 << 20) + b"[" * r.choice(DEEP)
    try:
        return op, _rewrite_meta(data, json.dumps(meta, allow_nan=True), fix=r.random() < 0.95)
    except (TypeError, ValueError):
        return op, _rewrite_meta(data, "{}")


def mutate_status(data: bytes, r: random.Random, corpus: list[bytes]) -> tuple[str, bytes]:
    op = r.choice(["flip", "truncate", "case", "pad", "random", "huge", "other"])
    if op == "flip":
        return op, _flip(data, r)
    if op == "truncate":
        return op, data[: r.randrange(len(data) + 1)]
    if op == "case":
        return op, data.upper() if r.random() < 0.5 else data.title()
    if op == "pad":
        return op, r.choice(
            [b" ", b"\0", b"\n", b"\xff"]
        ) + data if r.random() < 0.5 else data + r.choice([b" ", b"\0", b"\r\n"])
    if op == "random":
        return op, bytes(r.randrange(256) for _ in range(r.randrange(40)))
    if op == "huge":
        return op, data * r.choice([2, 100, 100_000])
    return op, r.choice(
        [
            b"gone",
            b"unknown",
            b"ONLINE",
            "önline".encode(),
            b"online\x00offline",
            b'"online"',
            b"{}",
        ]
    )


def mutate_active(data: bytes, r: random.Random, corpus: list[bytes]) -> tuple[str, bytes]:
    op = r.choice(["value", "drop", "add", "deep", "truncate", "flip", "raw", "previous"])
    report = json.loads(data)
    if op == "value":
        report[r.choice(sorted(ACTIVE_FIELDS))] = r.choice(
            NASTY_JSON + NASTY_NUMBERS + ["x" * 5000, "fp32", "int8"]
        )
    elif op == "drop" and report:
        report.pop(r.choice(sorted(report)))
    elif op == "add":
        report[r.choice(["extra", "Version", "x" * 100])] = r.choice([1, "x", None])
    elif op == "previous":
        report["previous"] = r.choice(
            [[], ["v"] * 16, ["v"] * 17, [1], [None], [["v"]], "v", ["x" * 200]]
        )
    elif op == "deep":
        return op, b"[" * r.choice(DEEP)
    elif op == "truncate":
        return op, data[: r.randrange(len(data))]
    elif op == "flip":
        return op, _flip(data, r)
    elif op == "raw":
        return op, r.choice(
            [
                b"",
                b"null",
                b"[]",
                b"{",
                b'{"time": NaN}',
                b'{"time": 1e999}',
                b"\xff\xfe",
                b"{}" * 3,
                b"x" * 20000,
            ]
        )
    try:
        return op, json.dumps(report, allow_nan=True).encode()
    except (TypeError, ValueError):
        return op, b"{}"


def mutate_metrics(data: bytes, r: random.Random, corpus: list[bytes]) -> tuple[str, bytes]:
    name, out = wire_fuzz.mutate(data, r, corpus)
    return name, out


CHUNK_FIELDS = ["magic", "mid", "index", "count", "total", "size", "crc", "chunk_crc"]
NASTY_INTS = [0, 1, 2, 3, 4, 999, 1000, 1001, 2**16, 2**20, 2**20 + 1, 2**31, 2**32 - 1]


def mutate_chunk(data: bytes, r: random.Random, corpus: list[bytes]) -> tuple[str, bytes]:
    op = r.choice(["field", "field", "body", "truncate", "flip", "other_chunk", "extend"])
    fields = list(HEADER.unpack_from(data))
    body = data[HEADER.size:]
    if op == "field":
        i = r.randrange(1, len(CHUNK_FIELDS))
        if i == 1:
            fields[1] = bytes(r.randrange(256) for _ in range(16))
        elif CHUNK_FIELDS[i] == "total":
            fields[i] = r.choice(NASTY_INTS + [2**63, 2**64 - 1, 1 << 20, (1 << 20) + 1])
        else:
            fields[i] = r.choice(NASTY_INTS)
    elif op == "body":
        body = r.choice([b"", body[:-1], body + b"x", bytes(len(body)), body[::-1]])
    elif op == "truncate":
        return op, data[: r.randrange(len(data))]
    elif op == "flip":
        return op, _flip(data, r)
    elif op == "other_chunk":
        other = r.choice(corpus)
        fields, body = list(HEADER.unpack_from(other)), other[HEADER.size:]
    elif op == "extend":
        body = body + bytes(r.choice([1, 100, 5000]))
    if r.random() < 0.9:  # the attacker recomputes the chunk's checksum
        fields[-1] = zlib.crc32(body)
    return op, HEADER.pack(*fields) + body


def mutate_ack(data: bytes, r: random.Random, corpus: list[bytes]) -> tuple[str, bytes]:
    op = r.choice(["next", "bitmap", "status", "mid", "length", "flip", "magic"])
    magic, mid, nxt, bitmap, status = ACK.unpack(data)
    if op == "next":
        nxt = r.choice(NASTY_INTS)
    elif op == "bitmap":
        bitmap = r.choice([0, 1, 2**63, 2**64 - 1, r.getrandbits(64)])
    elif op == "status":
        status = r.randrange(256)
    elif op == "mid":
        mid = bytes(r.randrange(256) for _ in range(16))
    elif op == "length":
        return op, r.choice([data[:-1], data + b"\0", data * 2, b""])
    elif op == "flip":
        return op, _flip(data, r)
    elif op == "magic":
        magic = r.choice([b"EFLCHNK1", b"EFLCACK2", b"\0" * 8])
    return op, ACK.pack(magic, mid, nxt, bitmap, status)


# --- the run
# -----------------------------------------------------------------------------------------------


@dataclass
class Kind:
    name: str
    seeds: list[bytes]
    check: Callable[[bytes], Any]
    oracle: Callable[[Any], str | None]
    mutate: Callable[[bytes, random.Random, list[bytes]], tuple[str, bytes]]
    # the receiver's known state, set up before each (timed) check
    prepare: Callable[[], None] = lambda: None


def kinds(tmp_path) -> list[Kind]:
    rx = Receivers(tmp_path)
    regs = [
        encode(Envelope("register", 0, "d0", payload=Payload({}, meta)))
        for meta in (
            {"profile": json.dumps(PROFILE)},
            {
                "profile": json.dumps(PROFILE),
                "ready": True,
                "num_samples": 500,
                "incarnation": "base",
                "epoch": "epoch1",
            },
            {
                "profile": json.dumps(PROFILE),
                "ready": True,
                "num_samples": 800,
                "incarnation": "next",
                "tier": "2",
            },
        )
    ]
    reports = [
        json.dumps(x).encode()
        for x in (
            {
                "version": "v3",
                "digest": "ab" * 32,
                "tier": "2",
                "format": "int8",
                "previous": ["v2", "v1"],
                "time": 1.7e9,
            },
            {
                "version": None,
                "digest": None,
                "tier": None,
                "format": None,
                "previous": [],
                "time": 1.7e9,
                "error": "digest mismatch",
            },
        )
    ]
    want = METRICS_WANT
    metrics = [
        encode(
            Envelope(
                kind,
                want.round,
                want.device_id,
                fleet=want.fleet,
                algorithm=want.algorithm,
                tier=want.tier,
                payload=Payload({}, meta),
                run=want.run,
                nonce=want.nonce,
            )
        )
        for kind, meta in (
            ("metrics", {"accuracy": 0.61, "loss": 1.2, "samples": 100.0}),
            ("error", {"reason": "oom"}),
        )
    ]
    return [
        Kind("register", regs, rx.register, register_oracle, mutate_register, rx.prepare_register),
        Kind("status", [b"online", b"offline"], parse_status, status_oracle, mutate_status),
        Kind("active", reports, parse_active, active_oracle, mutate_active),
        Kind("metrics", metrics, rx.metrics, metrics_oracle, mutate_metrics),
        Kind("chunk", rx.chunks, rx.chunk, chunk_oracle, mutate_chunk, rx.prepare_chunk),
        Kind(
            "ack",
            [
                pack_ack(b"\x05" * 16, n, b, s)
                for n, b, s in ((1, 0, 0), (3, 0b101, 0), (9, 0, 1), (0, 0, 2))
            ],
            rx.ack,
            ack_oracle,
            mutate_ack,
            rx.prepare_ack,
        ),
    ]


def fuzz(all_kinds: list[Kind], n: int, seed: int = 0) -> Tally:
    """``n`` mutations spread evenly over the kinds, each timed."""
    r = random.Random(seed)
    tally = Tally()
    candidates: dict[str, list[tuple[float, float, str, bytes]]] = {}
    for i in range(n):
        kind = all_kinds[i % len(all_kinds)]
        base = kind.seeds[(i // len(all_kinds)) % len(kind.seeds)]
        with np.errstate(all="ignore"):
            op, data = kind.mutate(base, r, kind.seeds)
        tally.cases += 1
        kind.prepare()
        t0 = time.perf_counter()
        label = f"{kind.name} {op}"
        outcome = wire_fuzz.outcome(kind.check, kind.oracle, data, label, tally.problems)
        seconds = time.perf_counter() - t0
        slow = candidates.setdefault(kind.name, [])
        slow.append((seconds / max(len(data), 1), seconds, op, data))
        if len(slow) > 64:  # keep the slowest per byte and the slowest overall
            slow.sort(key=lambda c: c[0], reverse=True)
            keep = slow[:5] + sorted(slow[5:], key=lambda c: c[1], reverse=True)[:5]
            slow[:] = keep
        tally.outcomes[(kind.name, outcome)] += 1
        tally.operators[(kind.name, op.split(":")[0], outcome)] += 1
    # the slowest cases again, best of 5: a scheduling pause is not the message's cost
    for kind in all_kinds:
        worst = tally.worst[kind.name] = {
            "seconds_per_byte": 0.0,
            "bytes": 0,
            "seconds": 0.0,
            "max_seconds": 0.0,
            "max_seconds_bytes": 0,
        }
        for _, _, op, data in candidates.get(kind.name, []):
            best = min(_timed(kind, data) for _ in range(5))
            if best / max(len(data), 1) > worst["seconds_per_byte"]:
                worst.update(
                    seconds_per_byte=best / max(len(data), 1),
                    bytes=len(data),
                    seconds=best,
                    operator=op,
                )
            if best > worst["max_seconds"]:
                worst.update(max_seconds=best, max_seconds_bytes=len(data), max_seconds_operator=op)
    return tally


def _timed(kind: Kind, data: bytes) -> float:
    from edgefl.wire import envelope

    kind.prepare()
    envelope._checked_header.cache_clear()  # time the check itself, not a remembered answer
    t0 = time.perf_counter()
    try:
        kind.check(data)
    except Exception:  # noqa: BLE001, S110 - only the time matters here; outcomes were tallied
        pass
    return time.perf_counter() - t0
