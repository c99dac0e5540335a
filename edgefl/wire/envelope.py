"""The one message shape of edgefl: an envelope = one safetensors blob.

Tensors carry the algorithm's payload; the safetensors header's string metadata carries the
routing fields (schema, kind, fleet, round, device, message id, algorithm, tier, run, nonce), the
payload's small scalar metadata as one JSON object, and a CRC-32 checksum.

Nothing that arrives here is ever unpickled, ``torch.load``-ed or ``eval``-ed. Decoding goes, in
order: the message size; the 8-byte header length (bounded); ``json.loads`` of the header (linear;
a text nested past the interpreter's recursion limit is refused by it, with no second pass over
the text), then its nesting depth (bounded), of which edgefl reads only ``__metadata__``
(:func:`parse_json`, the one JSON reader for whatever a device sends); the routing fields and
the payload metadata against their pydantic models (:mod:`edgefl.wire.schema`); then the tensor
entries of the parsed header as the ``safetensors`` library checks them
(:func:`~edgefl.wire.layout.tensor_layout`: each a dtype of the whitelist, a shape, two offsets,
the byte ranges tiling the body; the arrays are read-only views of the message, not copies);
then finite values, and the checksum. Every failure is a :class:`~edgefl.errors.WireError`.

**What the checksum is for.** It covers the routing fields, the metadata and every tensor's name,
dtype, shape and bytes, and catches corruption and a message relabelled by something that does not
recompute it. It has no key, so it does not authenticate: who may publish what is the broker's
business (per-device credentials or certificates, the ACL in ``broker/``), and TLS keeps messages
from being read or changed on the way. Replays are refused by the nonce: each request carries a
fresh one that its reply must echo, with the run id and the algorithm (see
:func:`edgefl.wire.validate.check_reply`), so an old update relabelled to the current round does
not match the request it pretends to answer. CRC-32 rather than SHA-256 because it is ~2x faster
(benchmarks/overhead) and a cryptographic digest without a key bought nothing more.
"""

from __future__ import annotations

import json
import os
import secrets
import struct
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgefl.errors import WireError
from edgefl.wire.crc import crc32
from edgefl.wire.jsontext import json_writer, parse_json, parse_json_depth
from edgefl.wire.layout import DTYPES as _DTYPES
from edgefl.wire.layout import NUMPY as _NUMPY
from edgefl.wire.layout import malformed, tensor_layout
from edgefl.wire.schema import KINDS, SCHEMA_VERSION, Header, check_meta, validate

Scalar = str | int | float | bool


#: json.dumps(..., sort_keys=True): the routing fields as their CRC covers them
_CANONICAL = json_writer(sort_keys=True)
#: json.dumps(..., sort_keys=True, allow_nan=False): a payload's metadata
_META_JSON = json_writer(sort_keys=True, allow_nan=False)
#: json.dumps(..., separators=(",", ":"), ensure_ascii=False): the safetensors header's JSON
_HEADER_JSON = json_writer(separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class Limits:
    """What a decoder accepts. Enforced by edgefl itself: brokers' limits are not trusted."""

    max_bytes: int = 256 * 1024 * 1024
    max_tensors: int = 4096
    max_header_bytes: int = 4 * 1024 * 1024
    max_depth: int = 4  # an envelope's header nests 3 deep: {name: {"shape": [..]}}


@dataclass
class Payload:
    """What an algorithm sends: named arrays plus small scalar metadata.

    Arrays of a decoded payload are read-only views of the received message: copy to modify."""

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


def new_nonce() -> str:
    return secrets.token_hex(16)


def new_message_id() -> str:
    """``uuid.uuid4().hex`` (16 random bytes, the version and variant bits set as RFC 4122 sets
    them) without building a UUID object, which cost more than the rest of an Envelope."""
    b = bytearray(os.urandom(16))
    b[6] = (b[6] & 0x0F) | 0x40  # version 4
    b[8] = (b[8] & 0x3F) | 0x80  # variant: RFC 4122
    return b.hex()


@dataclass(frozen=True)
class Envelope:
    kind: str
    round: int
    device_id: str
    fleet: str = "default"
    algorithm: str = ""
    tier: str = ""
    payload: Payload = field(default_factory=Payload)
    message_id: str = field(default_factory=new_message_id)
    run: str = ""  # the server's run id
    nonce: str = ""  # a request's fresh nonce; a reply echoes it

    def reply(
        self, kind: str, payload: Payload | None = None, *, algorithm: str | None = None
    ) -> Envelope:
        """The answer to this request: same routing, run and nonce; the replier's algorithm."""
        return Envelope(
            kind=kind,
            round=self.round,
            device_id=self.device_id,
            fleet=self.fleet,
            algorithm=self.algorithm if algorithm is None else algorithm,
            tier=self.tier,
            payload=payload or Payload(),
            run=self.run,
            nonce=self.nonce,
        )


def _routing_crc(routing: Mapping[str, str]) -> int:
    """CRC-32 of the routing fields but the checksum: the start of :func:`_checksum`."""
    if "checksum" in routing:
        routing = {k: v for k, v in routing.items() if k != "checksum"}
    return crc32(_CANONICAL(routing).encode())


def _checksum(
    routing: Mapping[str, str] | int, tensors: list[tuple[str, str, tuple[int, ...], Any]]
) -> str:
    """CRC-32 of the routing fields (all but the checksum) and each tensor's name, dtype tag,
    shape and bytes, tensors in name order. ``routing`` may be its :func:`_routing_crc`."""
    crc = routing if isinstance(routing, int) else _routing_crc(routing)
    for name, tag, shape, data in tensors:
        crc = crc32(f"|{name}|{tag}|{list(shape)}|".encode(), crc)
        crc = crc32(data, crc)
    return f"{crc:08x}"


def _dense(name: str, a: Any) -> np.ndarray:
    if (type(a) is np.ndarray and a.flags.c_contiguous and a.dtype in _DTYPES
            and a.dtype.byteorder != ">"):
        return a  # what the lines below would return, without their calls
    a = np.asarray(a)
    if a.dtype not in _DTYPES:
        raise WireError(
            f"tensor {name!r} has dtype {a.dtype}, not one of {sorted(t for t in _NUMPY)}"
        )
    a = np.require(a, requirements="C")  # not ascontiguousarray: it makes 0-d arrays 1-d
    return a if a.dtype.byteorder != ">" else a.astype(a.dtype.newbyteorder("<"))


def _arrays_and_routing(env: Envelope) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """What :func:`encode` checks before it writes: the arrays (dense, little-endian,
    whitelisted dtypes), the payload metadata (its kind's schema), and the routing fields but the
    checksum."""
    if env.kind not in KINDS:
        raise WireError(f"unknown message kind {env.kind!r}")
    arrays = {name: _dense(name, a) for name, a in env.payload.arrays.items()}
    if "__metadata__" in arrays:
        raise WireError("an array may not be named __metadata__ (the header's routing fields)")
    meta = dict(env.payload.meta)
    check_meta(env.kind, meta)
    routing = {
        "schema": SCHEMA_VERSION,
        "kind": env.kind,
        "fleet": env.fleet,
        "round": str(int(env.round)),
        "device": env.device_id,
        "message_id": env.message_id,
        "algorithm": env.algorithm,
        "tier": env.tier,
        "run": env.run,
        "nonce": env.nonce,
        "meta": _META_JSON(meta),
    }
    return arrays, routing


def _prepare(env: Envelope) -> tuple[dict[str, np.ndarray], dict[str, str], list, Header, int]:
    """What :func:`encode` checks and writes: the arrays (dense, little-endian, whitelisted
    dtypes), the routing header (validated as a receiver validates it), the tensors in name
    order, the checked header and the routing fields' CRC (:func:`_routing_crc`)."""
    arrays, routing = _arrays_and_routing(env)
    tensors = [
        (
            n,
            _DTYPES[arrays[n].dtype],
            arrays[n].shape,
            memoryview(arrays[n]).cast("B") if arrays[n].size else b"",
        )
        for n in sorted(arrays)
    ]
    start = _routing_crc(routing)
    routing["checksum"] = _checksum(start, tensors)
    header = validate(Header, routing, "envelope header")  # what we send must pass what we accept
    return arrays, routing, tensors, header, start


#: the checksum in a header whose size is computed without its bytes (:func:`checked_size`):
#: a valid checksum's length and form (eight hex digits), so the header validates and measures
#: as the real one
_NO_CHECKSUM = "0" * 8


def _checked_routing(env: Envelope) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """:func:`_arrays_and_routing`, the routing fields (a placeholder checksum among them)
    validated as a receiver validates a header: :func:`_prepare` without the tensors' bytes and
    the CRC."""
    arrays, routing = _arrays_and_routing(env)
    routing["checksum"] = _NO_CHECKSUM
    validate(Header, routing, "envelope header")
    return arrays, routing


def encode(env: Envelope) -> bytes:
    """Serialize an envelope to bytes: one safetensors blob, laid out as the safetensors library
    lays it out (:func:`_header_bytes`), the tensors' bytes copied once, into the message.

    The header it writes was checked here as a receiver checks it; that verdict is remembered
    (:func:`checked_header`), so that this process's own layers (the transport routing its own
    request, a device's log line reading its reply) do not check it again."""
    arrays, routing, _, header, start = _prepare(env)
    raw, ordered = _header_bytes(routing, arrays)
    # numpy arrays are buffers: join copies their bytes (dense, little-endian: _prepare)
    data = b"".join([struct.pack("<Q", len(raw)), raw, *ordered])
    if len(raw) <= HEADER_CACHE_BYTES:
        # the header's parse would give back these fields, this metadata (its JSON text, read
        # back), the arrays' count and a nesting of 3 (tensor entries hold lists) or 2
        meta = json.loads(routing["meta"])
        _CHECKED.put(raw, (header, meta, len(arrays), 3 if arrays else 2, header.routing(),
                           start, None))
    return data


#: safetensors writes tensors ordered by dtype (its enum, descending), then by name.
_ORDER = {"I64": 0, "F64": 1, "F32": 2, "I32": 3, "F16": 4, "U8": 5, "BOOL": 6}


def _header_text(
    routing: Mapping[str, str], arrays: Mapping[str, np.ndarray]
) -> tuple[str, list[np.ndarray]]:
    """The JSON header the safetensors library writes for these routing fields and arrays
    (compact, unpadded), and the arrays in the order their bytes follow it: by dtype as the
    library orders them, then by name."""
    entries, ordered, offset = {}, [], 0
    for name in sorted(arrays, key=lambda n: (_ORDER[_DTYPES[arrays[n].dtype]], n)):
        a = arrays[name]
        entries[name] = {
            "dtype": _DTYPES[a.dtype],
            "shape": list(a.shape),
            "data_offsets": [offset, offset + a.nbytes],
        }
        ordered.append(a)
        offset += a.nbytes
    return _HEADER_JSON({"__metadata__": dict(routing), **entries}), ordered


def _header_bytes(
    routing: Mapping[str, str], arrays: Mapping[str, np.ndarray]
) -> tuple[bytes, list[np.ndarray]]:
    """:func:`_header_text` in UTF-8, padded with spaces to a multiple of 8 (as the library
    pads it), and the arrays in the order their bytes follow it."""
    text, ordered = _header_text(routing, arrays)
    raw = text.encode()
    return raw + b" " * ((-len(raw)) % 8), ordered


def _header_size(routing: Mapping[str, str], arrays: Mapping[str, np.ndarray]) -> int:
    """The length of :func:`_header_bytes`' header, without its bytes."""
    text = _header_text(routing, arrays)[0]
    n = len(text) if text.isascii() else len(text.encode())
    return n + (-n) % 8


def encoded_size(env: Envelope) -> int:
    """``len(encode(env))``, computed without serializing (no copy of the arrays): what an
    in-memory exchange records as the message's bytes."""
    arrays, routing = _checked_routing(env)
    return 8 + _header_size(routing, arrays) + sum(a.nbytes for a in arrays.values())


def check(env: Envelope, limits: Limits = Limits()) -> Envelope:
    """What the receiver of ``encode(env)`` would get from :func:`decode`, without the bytes: the
    same checks (routing and metadata schema, dtype whitelist, the limits, finite values, BOOL
    bytes) and an envelope whose arrays are **read-only views** of the sender's (no copy). No
    checksum: nothing crosses a wire. Raises WireError where :func:`decode` would refuse the
    encoded message. The in-memory transport passes envelopes through this."""
    return checked_size(env, limits)[0]


def checked_size(env: Envelope, limits: Limits = Limits()) -> tuple[Envelope, int]:
    """:func:`check`'s envelope and :func:`encoded_size`'s size, from one pass."""
    arrays, routing = _checked_routing(env)
    if len(arrays) > limits.max_tensors:
        raise WireError(f"{len(arrays)} tensors exceed the limit of {limits.max_tensors}")
    header = _header_size(routing, arrays)
    if header > limits.max_header_bytes:
        raise WireError(f"header length {header} is out of bounds")
    size = 8 + header + sum(a.nbytes for a in arrays.values())
    if size > limits.max_bytes:
        raise WireError(f"message of {size} bytes exceeds the limit of {limits.max_bytes}")
    views = {}
    for name in sorted(arrays):
        a = arrays[name].view()
        a.flags.writeable = False
        if a.dtype == np.bool_ and a.size and a.view(np.uint8).max() > 1:
            raise WireError(f"tensor {name!r}: a BOOL byte other than 0 or 1")
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise WireError(f"tensor {name!r} has non-finite values")
        views[name] = a
    # a copy, as decode gives: the receiver cannot change the sender's
    meta = {} if routing["meta"] == "{}" else json.loads(routing["meta"])
    # every field as it is but the payload (what dataclasses.replace gives, without its walk of
    # the fields; a test holds this list to Envelope's fields)
    return Envelope(env.kind, env.round, env.device_id, env.fleet, env.algorithm, env.tier,
                    Payload(arrays=views, meta=meta), env.message_id, env.run, env.nonce), size


#: headers up to this size are checked once per distinct header (:class:`CheckedHeaders`)
HEADER_CACHE_BYTES = 16 * 1024

#: A header's check: its routing fields, its payload metadata, how many tensors it lists, how
#: deep it nests, the routing fields as an Envelope names them (``Header.routing()``), where
#: the checksum of the tensors starts: the routing fields' CRC (:func:`_routing_crc`), or the
#: checked routing fields themselves (a header that arrived: its CRC is computed by decode), and
#: the parsed header (None for what encode wrote), whose tensor entries decode checks.
Checked = tuple[Header, dict[str, Any], int, int, dict[str, Any], int | dict[str, str],
                dict[str, Any] | None]


class CheckedHeaders:
    """The verdicts on the last ``size`` distinct headers that passed every check (a header that
    fails is never remembered), keyed by the header's bytes. Two limits are held against a
    remembered verdict at each look, since readers differ in them: the nesting depth and the
    number of tensors; a header beyond either is checked afresh (and refused). The size bound is
    checked before any look (:func:`checked_header`)."""

    def __init__(self, size: int = 1024):
        self.size = size
        self.entries: OrderedDict[bytes, Checked] = OrderedDict()  # C-implemented: thread-safe
        self.hits = 0

    def get(self, raw: bytes, limits: Limits) -> Checked | None:
        entry = self.entries.get(raw)
        if entry is None or entry[3] > limits.max_depth or entry[2] > limits.max_tensors:
            return None
        self.hits += 1
        return entry

    def put(self, raw: bytes, entry: Checked) -> None:
        self.entries[raw] = entry
        while len(self.entries) > self.size:
            try:
                self.entries.popitem(last=False)
            except KeyError:  # another thread emptied it meanwhile
                break

    def cache_clear(self) -> None:
        self.entries.clear()
        self.hits = 0


_CHECKED = CheckedHeaders()


def checked_header(data: bytes, limits: Limits) -> Checked:
    """The check of an envelope's header (:data:`Checked`: its metadata and fields are shared,
    copy them before changing them); its tensors are not read.

    A message is looked at by several layers (the transport routes and de-duplicates it, the
    runtime decodes it, a log line reads its kind), so the check of a header of at most
    ``HEADER_CACHE_BYTES`` is remembered for the last 1024 distinct headers
    (:class:`CheckedHeaders`, which :func:`encode` also tells what it wrote): the same bytes give
    the same result, and a header that fails is never remembered."""
    if len(data) > limits.max_bytes:
        raise WireError(f"message of {len(data)} bytes exceeds the limit of {limits.max_bytes}")
    if len(data) < 8:
        raise WireError("message too short to be an envelope")
    (n,) = struct.unpack("<Q", bytes(data[:8]))
    if n > min(limits.max_header_bytes, len(data) - 8):
        raise WireError(f"header length {n} is out of bounds")
    raw = bytes(data[8 : 8 + n])
    entry = _CHECKED.get(raw, limits) if n <= HEADER_CACHE_BYTES else None
    if entry is None:
        entry = _check_header(raw, limits)
        if n <= HEADER_CACHE_BYTES:
            _CHECKED.put(raw, entry)
    return entry


def _check_header(raw: bytes, limits: Limits) -> Checked:
    header, depth = parse_json_depth(
        raw, max_bytes=limits.max_header_bytes, max_depth=limits.max_depth, what="header"
    )
    if not isinstance(header, dict):
        raise WireError("header is not a JSON object")
    tensors = len(header) - ("__metadata__" in header)
    if tensors > limits.max_tensors:
        raise WireError(f"{tensors} tensors exceed the limit of {limits.max_tensors}")
    routing = header.get("__metadata__")
    if not isinstance(routing, dict):
        raise WireError("envelope metadata is missing")
    if routing.get("schema") != SCHEMA_VERSION:
        raise WireError(
            f"schema version {str(routing.get('schema'))[:16]!r} is not supported (want "
            f"{SCHEMA_VERSION})"
        )
    checked = validate(Header, routing, "envelope header")  # frozen: safe to hand out again
    meta = parse_json(checked.meta, max_bytes=64 * 1024, max_depth=1, what="payload metadata")
    # strict and closed, the model took the fields as they are (strings): decode's checksum
    # starts from them (their CRC is computed there, for the messages that are decoded)
    return (checked, check_meta(checked.kind, meta), tensors, depth, checked.routing(), routing,
            header)


def decode(data: bytes, limits: Limits = Limits()) -> Envelope:
    """Parse and validate an envelope. Raises WireError with the reason on any defect, and
    nothing else. Its arrays are read-only views of ``data`` (no copy; a tensor whose bytes lie
    unaligned, which only another writer's order gives, is an aligned read-only copy)."""
    data = bytes(data)  # no copy when it is bytes already
    header, meta, _, _, fields, start, parsed = checked_header(data, limits)
    (n,) = struct.unpack_from("<Q", data)
    # the library reads UTF-8 without a byte-order mark only; json.loads (the header check) also
    # reads UTF-16, UTF-32 and a UTF-8 mark, by the first four bytes (and refuses bad UTF-8)
    if json.detect_encoding(data[8:16]) != "utf-8":
        raise malformed("the header is not UTF-8")
    if parsed is None:  # what this process encoded: its header, parsed again
        parsed = json.loads(data[8 : 8 + n])
    arrays: dict[str, np.ndarray] = {}
    tensors = []
    for name, tag, dtype, shape, begin, end in tensor_layout(parsed, len(data) - 8 - n):
        size = end - begin
        if size:
            a = np.frombuffer(data, dtype, size // dtype.itemsize, 8 + n + begin).reshape(shape)
            if not a.flags.aligned:  # a writer that ordered its tensors otherwise than the library
                a = a.copy()
                a.flags.writeable = False
        else:
            a = np.zeros(shape, dtype)
            a.flags.writeable = False
        if dtype == np.bool_ and a.size and a.view(np.uint8).max() > 1:
            raise WireError(f"tensor {name!r}: a BOOL byte other than 0 or 1")
        if dtype.kind == "f" and not np.isfinite(a).all():
            raise WireError(f"tensor {name!r} has non-finite values")
        arrays[name] = a
        tensors.append((name, tag, shape, memoryview(data)[8 + n + begin : 8 + n + end]))
    if _checksum(start, tensors) != header.checksum:
        raise WireError("checksum does not match")
    # the metadata's values are scalars: a copy is the caller's own
    return Envelope(payload=Payload(arrays=arrays, meta=dict(meta)), **fields)
