"""What tests/device_fuzz.py feeds its receivers and checks what they accept against: a mutator
per kind of message (as an attacker holding a device's credentials would: checksums recomputed)
and an oracle per kind, written apart from the schema checks."""

from __future__ import annotations

import json
import math
import random
import struct
import zlib
from typing import Any

from edgefl.transport.chunks import (
    ACK,
    HEADER,
    MAGIC,
)
from edgefl.wire import Envelope
from edgefl.wire.schema import Expectation
from tests import wire_fuzz
from tests.wire_fuzz import NASTY_JSON, NASTY_NUMBERS, _header
from tests.wire_oracles import _finite_number, _routing_problem

METRICS_WANT = Expectation("evaluate", 3, "d0", "lab", "2", "run1", "n" * 32, "fedavg")


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


def status_oracle(status: tuple[str, str | None]) -> str | None:
    word, session = status
    if word not in ("online", "offline"):
        return "status word"
    if session is not None and not (
        len(session) == 16 and all(c in "0123456789abcdef" for c in session)
    ):
        return "status session"
    return None


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
