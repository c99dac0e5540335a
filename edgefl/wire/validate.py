"""Checks on messages beyond the envelope codec: routing peeks and replies against requests.

- :func:`peek` reads and checks only the routing header and metadata of an envelope (size,
  depth, schema) without touching its tensors, so a transport can route, acknowledge and
  de-duplicate by message id cheaply. The full :func:`edgefl.wire.decode` still runs before use.
- :func:`check_reply` holds a decoded reply against the request it claims to answer
  (:class:`~edgefl.wire.schema.Expectation`): same device, fleet, round, tier, run and nonce, the
  same algorithm, the kind the request asks for (or ``error``), the arrays the method declares
  (dtype and shape per key), and no more samples than the device declared it holds.
- :func:`parse_profile`, :func:`parse_status` and :func:`parse_active`: what else a device sends
  (its registration's profile, its retained status and session, its model agent's report), held
  to the envelope's standard: bounded size and depth, a closed schema, WireError and nothing else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from edgefl.errors import WireError
from edgefl.wire.envelope import Envelope, Limits, checked_header, parse_json
from edgefl.wire.schema import (
    DEVICE_STATES,
    MAX_PROFILE_BYTES,
    REPLY_KINDS,
    SESSION_HEX,
    ActiveReport,
    Expectation,
    ProfileModel,
    check_arrays,
    validate,
)

MAX_ACTIVE_BYTES = 16 * 1024


@dataclass(frozen=True)
class Routing:
    """The routing fields of an envelope, read without decoding its tensors."""

    kind: str
    round: int
    device_id: str
    fleet: str
    message_id: str
    algorithm: str
    tier: str
    meta: dict
    size: int
    run: str = ""
    nonce: str = ""


def peek(data: bytes, limits: Limits = Limits()) -> Routing:
    """Routing fields of an envelope; raises WireError on anything that is not one."""
    _, meta, _, _, fields, _, _ = checked_header(data, limits)
    # the metadata's values are scalars: a copy is the caller's own
    return Routing(meta=dict(meta), size=len(data), **fields)


def check_reply(reply: Envelope, want: Expectation) -> None:
    """Raise WireError naming the first way ``reply`` does not answer the request ``want``
    describes."""
    if reply.round != want.round:  # asynchronous runs: the model version an update trained from
        which = "from the future" if reply.round > want.round else "it was not sent"
        raise WireError(f"reply names round (model version) {reply.round}; the request it "
                        f"answers is round {want.round}: a version {which}")
    fields = (
        ("device", reply.device_id, want.device_id),
        ("fleet", reply.fleet, want.fleet),
        ("run", reply.run, want.run),
        ("nonce", reply.nonce, want.nonce),
        ("algorithm", reply.algorithm, want.algorithm),
    )
    for name, got, expected in fields:
        if got != expected:
            raise WireError(
                f"reply {name} {str(got)[:64]!r} does not match the request's "
                f"{str(expected)[:64]!r}"
            )
    # arrays travel in updates, and in a finish reply when the request asked for the final model
    model_reply = reply.kind == "done" and want.kind == "finish" and want.arrays is not None
    if reply.kind != "update" and reply.payload.arrays and not model_reply:
        raise WireError(
            f"a {reply.kind!r} reply carries {len(reply.payload.arrays)} arrays; only updates "
            "(and asked-for final models) carry any"
        )
    if reply.kind == "error":
        return
    if reply.tier != want.tier:
        raise WireError(f"reply from tier {reply.tier!r}, assigned tier {want.tier!r}")
    expect = REPLY_KINDS.get(want.kind)
    if reply.kind != expect:
        raise WireError(f"a {reply.kind!r} reply to a {want.kind!r} request (expected {expect!r})")
    if model_reply and reply.payload.arrays:  # a device that keeps its model answers without it
        check_arrays(reply.payload.arrays, want.arrays, "final model")
    if reply.kind == "update":
        check_arrays(reply.payload.arrays, want.arrays, "uplink")
        n = reply.payload.meta["num_samples"]  # present: the update schema requires it
        if want.max_samples and n > want.max_samples:
            raise WireError(f"uplink claims {n} samples; the device declared {want.max_samples}")


# --- what else a device sends: registration profiles, status words, model reports -----------------


def parse_profile(text: str) -> dict[str, Any]:
    """A registration's profile (JSON text, already bounded by :class:`RegisterMeta`): a flat
    object of bounded scalars, parsed by the wire's one JSON reader. Raises WireError only."""
    value = parse_json(text, max_bytes=MAX_PROFILE_BYTES, max_depth=1, what="device profile")
    validate(ProfileModel, value, "device profile")
    return value


_SESSION = re.compile(f"[0-9a-f]{{{SESSION_HEX}}}")


def parse_status(data: bytes) -> tuple[str, str | None]:
    """A device's retained status: its state word (``online`` / ``offline``), then one space and
    its session (:data:`~edgefl.wire.schema.SESSION_HEX` lowercase hex digits), which an earlier
    version's devices leave out. Returns (state, session or None). Raises WireError only."""
    limit = 8 + SESSION_HEX
    if len(data) > limit:
        raise WireError(f"a device status of {len(data)} bytes (limit {limit})")
    text = data.decode("ascii", "replace")
    word, space, session = text.partition(" ")
    if word not in DEVICE_STATES:
        raise WireError(f"a device status {word[:16]!r} is not one of {sorted(DEVICE_STATES)}")
    if space and not _SESSION.fullmatch(session):
        raise WireError(
            f"a device status session {session[:32]!r} is not {SESSION_HEX} lowercase hex digits"
        )
    return word, (session if space else None)


def parse_active(data: bytes) -> dict[str, Any]:
    """A model agent's report on ``devices/<id>/active``, checked against :class:`ActiveReport`."""
    value = parse_json(data, max_bytes=MAX_ACTIVE_BYTES, max_depth=2, what="model report")
    return validate(ActiveReport, value, "model report").model_dump(exclude_none=True)
