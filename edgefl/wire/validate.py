"""Checks on messages beyond the envelope codec: routing peeks and expected uplink shapes.

Two uses:

- :func:`peek` reads only the routing header of an envelope (size limit, JSON header, known
  kind) without touching its tensors, so a transport can route, acknowledge and de-duplicate
  by message id cheaply. The full :func:`edgefl.wire.decode` still runs before any use.
- :func:`check_uplink` compares a decoded uplink with what the server half declares for that
  device (``ServerHalf.expected_uplink(device_id)``: ``{name: shape or None}``, or None for no
  check). Declared names must be present with the declared shape; an array the declaration does
  not name is refused when it sits in a namespace the declaration owns (the text up to the first
  ``/``: ``w/`` for model weights), and passed through otherwise, so methods that add arrays of
  their own namespace on top of a parent's declaration keep working. An empty declaration means
  "no arrays at all" (a purely local method).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass

from edgefl.errors import WireError
from edgefl.wire.envelope import KINDS, SCHEMA_VERSION, Limits, Payload

Shape = tuple[int, ...]


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


def peek(data: bytes, limits: Limits = Limits(), *, max_meta_bytes: int = 64 * 1024) -> Routing:
    """Routing fields of an envelope; raises WireError on anything that is not one."""
    if len(data) > limits.max_bytes:
        raise WireError(f"message of {len(data)} bytes exceeds the limit of {limits.max_bytes}")
    if len(data) < 8:
        raise WireError("message too short to be an envelope")
    (n,) = struct.unpack("<Q", bytes(data[:8]))
    if n > min(limits.max_header_bytes, len(data) - 8):
        raise WireError(f"header length {n} is out of bounds")
    try:
        header = json.loads(bytes(data[8 : 8 + n]))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WireError(f"header is not JSON: {e}") from None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(meta, dict):
        raise WireError("envelope metadata is missing")
    missing = [k for k in ("schema", "kind", "fleet", "round", "device", "message_id", "algorithm", "tier", "meta") if k not in meta]
    if missing:
        raise WireError(f"envelope metadata is missing routing fields: {', '.join(missing)}")
    if meta["schema"] != SCHEMA_VERSION:
        raise WireError(f"schema version {meta['schema']!r} is not supported (want {SCHEMA_VERSION})")
    if meta["kind"] not in KINDS:
        raise WireError(f"unknown message kind {meta['kind']!r}")
    try:
        rnd = int(meta["round"])
    except (TypeError, ValueError):
        raise WireError(f"round {meta['round']!r} is not an integer") from None
    payload_meta: dict = {}
    if len(meta["meta"]) <= max_meta_bytes:
        try:
            payload_meta = json.loads(meta["meta"])
        except json.JSONDecodeError as e:
            raise WireError(f"payload metadata is not JSON: {e}") from None
        if not isinstance(payload_meta, dict):
            raise WireError("payload metadata is not a JSON object")
    return Routing(
        kind=meta["kind"],
        round=rnd,
        device_id=str(meta["device"]),
        fleet=str(meta["fleet"]),
        message_id=str(meta["message_id"]),
        algorithm=str(meta["algorithm"]),
        tier=str(meta["tier"]),
        meta=payload_meta,
        size=len(data),
    )


def _namespace(name: str) -> str:
    head, sep, _ = name.partition("/")
    return head + sep if sep else ""


def check_uplink(payload: Payload, expected: Mapping[str, Shape | None] | None) -> None:
    """Raise WireError naming the first array that does not match the declaration."""
    if expected is None:
        return
    if not expected and payload.arrays:
        raise WireError(f"uplink carries {len(payload.arrays)} arrays, expected none (first: {next(iter(payload.arrays))!r})")
    for name, shape in expected.items():
        if name not in payload.arrays:
            raise WireError(f"uplink is missing array {name!r}")
        got = tuple(payload.arrays[name].shape)
        if shape is not None and got != tuple(shape):
            raise WireError(f"array {name!r} has shape {got}, expected {tuple(shape)}")
    owned = {_namespace(n) for n in expected} - {""}
    for name in payload.arrays:
        if name not in expected and _namespace(name) in owned:
            raise WireError(f"unexpected array {name!r} in the {_namespace(name)!r} namespace")
