"""The oracles of tests/wire_fuzz.py, written apart from the wire's schema checks: what an accepted
uplink or downlink must satisfy (its routing, its meta, the arrays the exchange expects)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from edgefl.wire import Envelope
from edgefl.wire.envelope import _DTYPES
from edgefl.wire.schema import Expectation

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


TOKEN = re.compile(r"[A-Za-z0-9_-]{0,64}")


TIER = re.compile(r"[A-Za-z0-9._/:-]{0,64}")


def _finite_number(v: Any, lo: float = -1e12, hi: float = 1e12) -> bool:
    return (
        isinstance(v, (int, float))
        and not isinstance(v, bool)
        and math.isfinite(v)
        and lo <= v <= hi
    )


def _routing_problem(env: Envelope) -> str | None:
    if not (NAME.fullmatch(env.fleet) and (env.device_id == "*" or NAME.fullmatch(env.device_id))):
        return "fleet/device charset"
    if not (
        TOKEN.fullmatch(env.algorithm)
        and TOKEN.fullmatch(env.run)
        and TOKEN.fullmatch(env.nonce)
        and TIER.fullmatch(env.tier)
    ):
        return "token charset"
    if not (isinstance(env.round, int) and 0 <= env.round < 10**9):
        return "round range"
    meta = env.payload.meta
    if len(meta) > 64:
        return "too many metadata fields"
    for k, v in meta.items():
        if isinstance(v, str):
            if len(v) > 16 * 1024:
                return f"metadata {k} too long"
        elif not (isinstance(v, bool) or _finite_number(v)):
            return f"metadata {k} not a bounded scalar"
    for name, a in env.payload.arrays.items():
        if a.dtype not in _DTYPES:
            return f"array {name} dtype"
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            return f"array {name} not finite"
    return None


def _up_oracle(accept, device_id) -> Callable[[Envelope], str | None]:
    want = _expectation(accept, device_id)

    def oracle(env: Envelope) -> str | None:
        problem = _routing_problem(env)
        if problem:
            return problem
        echo = (env.device_id, env.fleet, env.round, env.run, env.nonce, env.algorithm)
        if echo != (want.device_id, want.fleet, want.round, want.run, want.nonce, want.algorithm):
            return "reply does not echo its request"
        meta = env.payload.meta
        if env.kind != "update" and env.payload.arrays:
            return "arrays in a reply that is no update"
        if env.kind == "error":
            return None if isinstance(meta.get("reason"), str) else "error without a reason"
        if env.tier != want.tier:
            return "tier"
        if env.kind == "update":
            n = meta.get("num_samples")
            if not (
                isinstance(n, int)
                and not isinstance(n, bool)
                and 1 <= n <= (want.max_samples or 10**9)
            ):
                return "num_samples"
            for k in ("train_loss", "train_seconds", "samples_seen"):
                if k in meta and not _finite_number(meta[k], -1e12 if k == "train_loss" else 0.0):
                    return k
            if want.arrays is not None:
                if set(env.payload.arrays) != set(want.arrays):
                    return "array names"
                for name, spec in want.arrays.items():
                    a = env.payload.arrays[name]
                    if a.dtype != spec.dtype:
                        return f"array {name} dtype"
                    if spec.shape is not None and (
                        a.ndim != len(spec.shape)
                        or any(
                            s is not None and s != g
                            for s, g in zip(spec.shape, a.shape, strict=True)
                        )
                    ):
                        return f"array {name} shape"
        elif env.kind == "metrics":
            if not (_finite_number(meta.get("accuracy"), 0.0, 1.0)):
                return "accuracy"
        return None

    return oracle


def _down_oracle(agent) -> Callable[[Envelope], str | None]:
    def oracle(env: Envelope) -> str | None:
        problem = _routing_problem(env)
        if problem:
            return problem
        if (env.device_id, env.fleet, env.algorithm) != (
            agent.device_id,
            agent.fleet,
            agent.algorithm,
        ):
            return "a request for another device, fleet or algorithm"
        if agent.run_id is not None and env.run != agent.run_id:
            return "a request of another run"
        declared = agent.half.expected_downlink()
        if env.payload.arrays and declared is not None:
            names = set(env.payload.arrays)
            # an array of a group may be absent with its whole group; a None axis is any length
            groups = {spec.group for name, spec in declared.items() if name in names}
            required = {
                name
                for name, spec in declared.items()
                if spec.group is None or spec.group in groups
            }
            if not required <= names <= set(declared):
                return "downlink array names"
            for name in names:
                spec, a = declared[name], env.payload.arrays[name]
                if a.dtype != spec.dtype:
                    return f"downlink array {name}"
                if spec.shape is not None and (
                    a.ndim != len(spec.shape)
                    or any(
                        w is not None and g != w for g, w in zip(a.shape, spec.shape, strict=False)
                    )
                ):
                    return f"downlink array {name}"
        return None

    return oracle


def _expectation(accept, device_id):
    """The Expectation the loop built for this exchange (a cell of the accept closure)."""
    for cell in accept.__closure__ or ():
        value = cell.cell_contents
        if isinstance(value, dict) and isinstance(value.get(device_id), Expectation):
            return value[device_id]
    raise LookupError("no expectation in the accept closure")
