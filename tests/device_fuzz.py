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
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgefl.errors import WireError
from edgefl.transport.chunks import (
    ChunkSender,
    ChunkSettings,
    Reassembler,
    pack_ack,
    split,
)
from edgefl.wire import Envelope, Payload, decode, encode
from edgefl.wire.validate import check_reply, parse_active, parse_status
from tests import wire_fuzz
from tests.device_fuzz_cases import (
    METRICS_WANT,
    PROFILE,
    ack_oracle,
    active_oracle,
    chunk_oracle,
    metrics_oracle,
    mutate_ack,
    mutate_active,
    mutate_chunk,
    mutate_metrics,
    mutate_register,
    mutate_status,
    register_oracle,
    status_oracle,
)

KINDS = ("register", "status", "active", "metrics", "chunk", "ack")


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


# --- oracles: the schemas restated in plain Python
# ----------------------------------------------------


# --- mutation
# ------------------------------------------------------------------------------------------


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
        Kind("status", [b"online", b"offline", b"online 0123456789abcdef",
                        b"offline fedcba9876543210"], parse_status, status_oracle, mutate_status),
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
    envelope._CHECKED.cache_clear()  # time the check itself, not a remembered answer
    t0 = time.perf_counter()
    try:
        kind.check(data)
    except Exception:  # noqa: BLE001, S110 - only the time matters here; outcomes were tallied
        pass
    return time.perf_counter() - t0

