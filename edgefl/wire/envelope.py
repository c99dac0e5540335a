"""The one message shape of edgefl: an envelope = one safetensors blob.

Tensors carry the algorithm's payload; the safetensors header's string metadata carries the
routing fields (schema, kind, fleet, round, device, message id, algorithm, tier), the payload's
small scalar metadata as one JSON object, and a SHA-256 digest of the body.

Nothing that arrives here is ever unpickled, ``torch.load``-ed or ``eval``-ed: the header is
parsed with ``json.loads`` and checked (size, kinds, dtypes, shapes, offsets that tile the body
exactly) *before* any tensor byte is read, and float tensors must be finite.

The safetensors layout (8-byte little-endian header length, JSON header padded to 8 bytes,
tensor bytes at the header's offsets) is written and read here directly: the ``safetensors``
package's numpy path copies every tensor twice on the way out and once more on the way in,
which for a ResNet-18-sized payload (45 MB) cost more than the SHA-256 digest. The files are
plain safetensors either way (tests read ours with the package and the package's with ours).
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from edgefl.errors import WireError

SCHEMA_VERSION = "1"

#: Message kinds. Server → device: train, evaluate, finish, assign, ack.
#: Device → server: update, metrics, done, error, register, ack.
KINDS = frozenset(
    {"train", "update", "evaluate", "metrics", "finish", "done", "error", "register", "assign", "ack"}
)

#: dtype whitelist: numpy dtype ↔ safetensors dtype tag.
_DTYPES = {
    np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16",
    np.dtype(np.float64): "F64",
    np.dtype(np.int64): "I64",
    np.dtype(np.int32): "I32",
    np.dtype(np.uint8): "U8",
    np.dtype(np.bool_): "BOOL",
}
_TAGS = set(_DTYPES.values())
_NUMPY = {tag: dtype for dtype, tag in _DTYPES.items()}
_ITEMSIZE = {"F32": 4, "F16": 2, "F64": 8, "I64": 8, "I32": 4, "U8": 1, "BOOL": 1}
_ROUTING = ("schema", "kind", "fleet", "round", "device", "message_id", "algorithm", "tier")

Scalar = str | int | float | bool


@dataclass(frozen=True)
class Limits:
    """What a decoder accepts. Enforced by edgefl itself: brokers' limits are not trusted."""

    max_bytes: int = 256 * 1024 * 1024
    max_tensors: int = 4096
    max_header_bytes: int = 4 * 1024 * 1024


@dataclass
class Payload:
    """What an algorithm sends: named arrays plus small scalar metadata."""

    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Scalar] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.arrays) or bool(self.meta)

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays.values())

    def subset(self, prefix: str) -> dict[str, np.ndarray]:
        """The arrays whose names start with ``prefix``, with the prefix removed."""
        n = len(prefix)
        return {k[n:]: v for k, v in self.arrays.items() if k.startswith(prefix)}


@dataclass(frozen=True)
class Envelope:
    kind: str
    round: int
    device_id: str
    fleet: str = "default"
    algorithm: str = ""
    tier: str = ""
    payload: Payload = field(default_factory=Payload)
    message_id: str = field(default_factory=lambda: uuid.uuid4().hex)


def _digest(arrays: Mapping[str, np.ndarray], meta_json: str) -> str:
    h = hashlib.sha256(meta_json.encode())
    for name in sorted(arrays):
        a = arrays[name]
        h.update(f"{name}|{a.dtype.str}|{a.shape}".encode())
        h.update(np.ascontiguousarray(a).data)
    return h.hexdigest()


def _check_meta(meta: Mapping[str, Scalar]) -> None:
    for k, v in meta.items():
        if not isinstance(k, str) or not isinstance(v, (str, int, float, bool)):
            raise WireError(f"payload metadata {k!r} must be a str/int/float/bool, got {type(v).__name__}")
        if isinstance(v, float) and not math.isfinite(v):
            raise WireError(f"payload metadata {k!r} is not finite")


def encode(env: Envelope) -> bytes:
    """Serialize an envelope to bytes (one safetensors blob)."""
    if env.kind not in KINDS:
        raise WireError(f"unknown message kind {env.kind!r}")
    arrays = {}
    for name, a in env.payload.arrays.items():
        a = np.asarray(a)
        if a.dtype not in _DTYPES:
            raise WireError(f"tensor {name!r} has dtype {a.dtype}, not one of {sorted(_TAGS)}")
        arrays[name] = np.require(a, requirements="C")  # not ascontiguousarray: it makes 0-d arrays 1-d
    _check_meta(env.payload.meta)
    meta_json = json.dumps(env.payload.meta, sort_keys=True)
    header = {
        "schema": SCHEMA_VERSION,
        "kind": env.kind,
        "fleet": env.fleet,
        "round": str(int(env.round)),
        "device": env.device_id,
        "message_id": env.message_id,
        "algorithm": env.algorithm,
        "tier": env.tier,
        "meta": meta_json,
        "digest": _digest(arrays, meta_json),
    }
    return _serialize(arrays, header)


def _serialize(arrays: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> bytes:
    """One safetensors blob: tensors in name order, back to back, after the padded header."""
    if "__metadata__" in arrays:
        raise WireError("a tensor may not be named __metadata__")
    names = sorted(arrays)
    entries: dict[str, object] = {"__metadata__": dict(metadata)}
    offset = 0
    for name in names:
        a = arrays[name]
        entries[name] = {"dtype": _DTYPES[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    header = json.dumps(entries, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    bodies = [memoryview(arrays[name]).cast("B") for name in names if arrays[name].nbytes]
    return b"".join([struct.pack("<Q", len(header)), header, *bodies])


def _parse_header(data: bytes, limits: Limits) -> dict:
    if len(data) > limits.max_bytes:
        raise WireError(f"message of {len(data)} bytes exceeds the limit of {limits.max_bytes}")
    if len(data) < 8:
        raise WireError("message too short to be an envelope")
    (n,) = struct.unpack("<Q", data[:8])
    if n > min(limits.max_header_bytes, len(data) - 8):
        raise WireError(f"header length {n} is out of bounds")
    try:
        header = json.loads(data[8 : 8 + n])
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WireError(f"header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise WireError("header is not a JSON object")
    return header


def _tensors(data: bytes, header: Mapping[str, dict]) -> dict[str, np.ndarray]:
    """The tensors of a checked header: their byte ranges must tile the body exactly (no gaps,
    no overlaps, nothing left over); each is copied out of ``data`` once."""
    (n,) = struct.unpack("<Q", data[:8])
    start, body = 8 + n, len(data) - 8 - n
    spans = sorted((info["data_offsets"][0], info["data_offsets"][1], name) for name, info in header.items())
    end = 0
    for begin, stop, name in spans:
        if begin != end:
            raise WireError(f"tensor {name!r} does not start where the previous one ends")
        end = stop
    if end != body:
        raise WireError(f"the tensors cover {end} bytes of a {body}-byte body")
    arrays = {}
    for begin, _, name in spans:
        info = header[name]
        dtype, shape = _NUMPY[info["dtype"]], tuple(info["shape"])
        count = math.prod(shape)
        if count == 0:
            arrays[name] = np.empty(shape, dtype)
            continue
        if dtype == np.bool_:
            raw = np.frombuffer(data, np.uint8, count, start + begin)
            if (raw > 1).any():
                raise WireError(f"tensor {name!r}: a BOOL byte other than 0 or 1")
        arrays[name] = np.frombuffer(data, dtype, count, start + begin).reshape(shape).copy()
    return arrays


def decode(data: bytes, limits: Limits = Limits()) -> Envelope:
    """Parse and validate an envelope. Raises WireError with the reason on any defect."""
    data = bytes(data)  # no copy when it is bytes already
    header = _parse_header(data, limits)
    meta = header.pop("__metadata__", None)
    if not isinstance(meta, dict) or any(k not in meta for k in (*_ROUTING, "meta", "digest")):
        raise WireError("envelope metadata is missing routing fields")
    if meta["schema"] != SCHEMA_VERSION:
        raise WireError(f"schema version {meta['schema']!r} is not supported (want {SCHEMA_VERSION})")
    if meta["kind"] not in KINDS:
        raise WireError(f"unknown message kind {meta['kind']!r}")
    if len(header) > limits.max_tensors:
        raise WireError(f"{len(header)} tensors exceed the limit of {limits.max_tensors}")
    for name, info in header.items():
        if not isinstance(info, dict) or info.get("dtype") not in _TAGS:
            raise WireError(f"tensor {name!r} has a dtype outside the whitelist")
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if not (isinstance(shape, list) and all(isinstance(s, int) and s >= 0 for s in shape)):
            raise WireError(f"tensor {name!r} has an invalid shape")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int and o >= 0 for o in offsets)):
            raise WireError(f"tensor {name!r} has invalid offsets")
        if offsets[1] - offsets[0] != math.prod(shape) * _ITEMSIZE[info["dtype"]]:
            raise WireError(f"tensor {name!r}: byte length does not match its shape")
    arrays = _tensors(data, header)
    try:
        payload_meta = json.loads(meta["meta"])
        rnd = int(meta["round"])
    except Exception as e:  # safetensors raises its own error types
        raise WireError(f"malformed envelope: {e}") from None
    if not isinstance(payload_meta, dict):
        raise WireError("payload metadata is not a JSON object")
    _check_meta(payload_meta)
    for name, a in arrays.items():
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise WireError(f"tensor {name!r} has non-finite values")
    if _digest(arrays, meta["meta"]) != meta["digest"]:
        raise WireError("body digest does not match")
    return Envelope(
        kind=meta["kind"],
        round=rnd,
        device_id=meta["device"],
        fleet=meta["fleet"],
        algorithm=meta["algorithm"],
        tier=meta["tier"],
        payload=Payload(arrays=dict(arrays), meta=payload_meta),
        message_id=meta["message_id"],
    )
