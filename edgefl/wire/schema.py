"""The schema of every message: routing header, payload metadata per kind, arrays per method.

Three layers, each checked before anything reads what it guards:

- :class:`Header`: the routing fields in the safetensors header's ``__metadata__`` (all strings
  there, as safetensors wants), typed and bounded: charset and length of names, the round a
  non-negative integer, the checksum eight hex digits. Unknown fields are refused.
- the payload metadata of each kind (:data:`META_MODELS`): an update's ``num_samples`` is a positive
  int, losses and timings finite floats in range, an evaluation's accuracy in [0, 1]; every other
  field is a finite number, a bool or a bounded string (:class:`Meta`). Pydantic models in strict
  mode: ``"0.5"`` is not a float and ``true`` is not an int.
- the arrays a method declares (:class:`ArraySpec` per key: dtype and shape, ``None`` = any
  length along that axis), checked by :func:`check_arrays` against what arrived. A declaration is
  closed: an array it does not name is refused.

A pydantic error becomes a :class:`~edgefl.errors.WireError` naming the field (:func:`validate`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NamedTuple

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

from edgefl.errors import WireError

SCHEMA_VERSION = "2"

#: Message kinds. Server → device: train, evaluate, finish, assign, ack.
#: Device → server: update, metrics, done, error, register, ack.
Kind = Literal[
    "train", "update", "evaluate", "metrics", "finish", "done", "error", "register", "assign", "ack"
]
KINDS = frozenset(Kind.__args__)  # type: ignore[attr-defined]
#: What a device answers to each request kind ("error" is always acceptable).
REPLY_KINDS = {"train": "update", "evaluate": "metrics", "finish": "done"}

#: Largest round number, metadata value and count a message may carry (JSON numbers past
#: these are either mistakes or attacks; float32 overflows at 3.4e38).
MAX_ROUND = 10**9 - 1
MAX_SAMPLES = 10**9
MAX_ABS_METRIC = 1e12
MAX_META_FIELDS = 64
MAX_META_STRING = 16 * 1024
MAX_PROFILE_BYTES = 16 * 1024

Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
DeviceName = Annotated[str, StringConstraints(pattern=r"^(\*|[A-Za-z0-9][A-Za-z0-9._-]{0,63})$")]
Token = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{0,64}$")]
Tier = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._/:-]{0,64}$")]


class Header(BaseModel):
    """The routing fields of an envelope, as the safetensors header stores them (strings)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    schema_: Literal["2"] = Field(alias="schema")
    kind: Kind
    fleet: Name
    round: Annotated[str, StringConstraints(pattern=r"^(0|[1-9][0-9]{0,8})$")]
    device: DeviceName
    message_id: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]
    algorithm: Token
    tier: Tier
    run: Token  # the server's run (its epoch): a reply from another run is refused
    nonce: Token  # fresh in each request; a reply echoes its request's
    meta: Annotated[str, StringConstraints(max_length=64 * 1024)]
    checksum: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{8}$")]

    def routing(self) -> dict[str, Any]:
        """The routing fields as an Envelope (and a Routing) names them."""
        return {"kind": self.kind, "round": int(self.round), "device_id": self.device,
                "fleet": self.fleet, "algorithm": self.algorithm, "tier": self.tier,
                "message_id": self.message_id, "run": self.run, "nonce": self.nonce}


def _json_object(data: Any, name: str, fields: str, limit: int) -> None:
    """Refuse anything but a JSON object of at most ``limit`` fields (``name`` and ``fields``
    word the error)."""
    if not isinstance(data, dict):
        raise ValueError(f"{name} must be a JSON object")
    if len(data) > limit:
        raise ValueError(f"{len(data)} {fields} fields (limit {limit})")


def _bounded(key: str, value: Any) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        if abs(value) > MAX_ABS_METRIC:
            raise ValueError(f"{key} = {value} is out of range")
    elif isinstance(value, float):
        if not math.isfinite(value) or abs(value) > MAX_ABS_METRIC:
            raise ValueError(f"{key} = {value} is not a finite number within ±{MAX_ABS_METRIC:g}")
    elif isinstance(value, str):
        if len(value) > MAX_META_STRING:
            raise ValueError(
                f"{key} is a string of {len(value)} characters (limit {MAX_META_STRING})"
            )
    else:
        raise ValueError(f"{key} must be a str, int, float or bool, not {type(value).__name__}")


class Meta(BaseModel):
    """Payload metadata of any kind: scalar fields only, numbers finite and bounded."""

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _scalars(cls, data: Any) -> Any:
        _json_object(data, "payload metadata", "metadata", MAX_META_FIELDS)
        for key, value in data.items():
            _bounded(key, value)
        return data


Finite = Annotated[float, Field(ge=-MAX_ABS_METRIC, le=MAX_ABS_METRIC)]
NonNegative = Annotated[float, Field(ge=0.0, le=MAX_ABS_METRIC)]


class UpdateMeta(Meta):
    """A device's local work: how much data it trained on and how it went."""

    num_samples: Annotated[int, Field(ge=1, le=MAX_SAMPLES)]
    train_loss: Finite | None = None
    train_seconds: NonNegative | None = None
    samples_seen: NonNegative | None = None


class MetricsMeta(Meta):
    accuracy: Annotated[float, Field(ge=0.0, le=1.0)]
    loss: NonNegative | None = None
    samples: NonNegative | None = None


class ErrorMeta(Meta):
    reason: Annotated[str, StringConstraints(max_length=4096)]


class EvaluateMeta(Meta):
    split: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,32}$")] | None = None


class RegisterMeta(Meta):
    """A device's registration: closed (an unknown field is refused), every field bounded. The
    profile is JSON text, parsed apart by :func:`edgefl.wire.validate.parse_profile`."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)

    profile: Annotated[str, StringConstraints(max_length=MAX_PROFILE_BYTES)] = "{}"
    ready: bool = False
    tier: Tier | None = None
    num_samples: Annotated[int, Field(ge=1, le=MAX_SAMPLES)] | None = None
    epoch: Token | None = None  # the server epoch the device registers with
    # the device process's registration epoch (a new one per start)
    incarnation: Token | None = None

    @model_validator(mode="after")
    def _ready_declares(self) -> RegisterMeta:
        if self.ready and self.num_samples is None:
            raise ValueError("a ready device must declare num_samples")
        return self


class ProfileModel(BaseModel):
    """A device profile as it arrives: a flat object of at most 32 bounded scalars (its meaning is
    :class:`edgefl.profiling.DeviceProfile`'s to check)."""

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: Any) -> Any:
        _json_object(data, "the profile", "profile", 32)
        for key, value in data.items():
            if len(key) > 64:
                raise ValueError("a profile field name is longer than 64 characters")
            if value is not None:
                _bounded(key, value)
                if isinstance(value, str) and len(value) > 1024:
                    raise ValueError(f"{key} is a string of {len(value)} characters (limit 1024)")
        return data


class ActiveReport(BaseModel):
    """What a device's model agent publishes on ``devices/<id>/active`` (:mod:`edgefl.rollout`)."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)

    version: Annotated[str, StringConstraints(max_length=128)] | None = None
    digest: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{0,128}$")] | None = None
    tier: Annotated[str, StringConstraints(max_length=64)] | None = None
    format: Literal["fp32", "int8", ""] | None = None
    previous: Annotated[
        list[Annotated[str, StringConstraints(max_length=128)] | None], Field(max_length=16)
    ] = []
    time: Annotated[float, Field(ge=0.0, le=1e11)] = 0.0
    error: Annotated[str, StringConstraints(max_length=4096)] | None = None


#: What a device publishes, retained, on ``devices/<id>/status`` (its Last Will says "offline").
DEVICE_STATES = frozenset({"online", "offline"})
#: The hex digits of a device's session token: new for each process (each MQTT device endpoint),
#: it follows the state word after one space (``online 3f2a…``), in its Last Will too, so that the
#: server can tell a connection that drops and comes back from a device process that restarted.
SESSION_HEX = 16


def device_status(state: str, session: str) -> bytes:
    """A device's status message (:func:`edgefl.wire.validate.parse_status` reads it)."""
    if state not in DEVICE_STATES or len(session) != SESSION_HEX:
        raise ValueError(f"a device status needs a state of {sorted(DEVICE_STATES)} and a "
                         f"{SESSION_HEX}-digit session (got {state!r}, {session!r})")
    return f"{state} {session}".encode()

META_MODELS: dict[str, type[Meta]] = {
    "update": UpdateMeta,
    "metrics": MetricsMeta,
    "error": ErrorMeta,
    "evaluate": EvaluateMeta,
    "register": RegisterMeta,
}


def validate(model: type[BaseModel], data: Any, what: str) -> BaseModel:
    """``model.model_validate(data)``; a failure is a WireError naming the first bad field."""
    try:  # model.model_validate(data) without its Python frame
        return model.__pydantic_validator__.validate_python(data)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(root)"
        raise WireError(f"{what}: {where}: {err['msg']} ({e.error_count()} error(s))") from None


def check_meta(kind: str, meta: Any) -> dict[str, Any]:
    """The payload metadata of a ``kind`` message, checked; returns it as a plain dict. Empty
    metadata (most requests') is validated once per kind: the verdict depends on nothing else."""
    if type(meta) is dict and not meta and kind in _EMPTY_META_PASSES:
        return meta
    validate(META_MODELS.get(kind, Meta), meta, f"{kind} metadata")
    if type(meta) is dict and not meta:
        _EMPTY_META_PASSES.add(kind)
    return meta


#: the kinds whose metadata model accepted an empty dict (those requiring a field refuse it)
_EMPTY_META_PASSES: set[str] = set()


# --- arrays ----------------------------------------------------------------------------------


class ArraySpec(NamedTuple):
    """What one array of a message must be: its dtype, and its shape (None = any shape; a None
    axis = any length along it). ``group`` None: the array is in every message of the
    declaration; a name: the arrays of that group arrive all together or not at all (weights
    that only some rounds carry, a kernel with the images it was computed on)."""

    dtype: np.dtype
    shape: tuple[int | None, ...] | None = None
    group: str | None = None

    def describe(self) -> str:
        shape = (
            "any shape"
            if self.shape is None
            else "(" + ", ".join("*" if s is None else str(s) for s in self.shape) + ")"
        )
        return f"{np.dtype(self.dtype)} {shape}"


def spec_of(array: Any) -> ArraySpec:
    """The spec an array itself satisfies (the server's copy of a weight, say)."""
    a = np.asarray(array)
    return ArraySpec(a.dtype, tuple(a.shape))


def array_spec(
    dtype: Any, shape: tuple[int | None, ...] | None = None, group: str | None = None
) -> ArraySpec:
    return ArraySpec(np.dtype(dtype), None if shape is None else tuple(shape), group)


def in_group(specs: Mapping[str, ArraySpec], group: str) -> dict[str, ArraySpec]:
    """``specs`` as members of ``group`` (they arrive all together or not at all)."""
    return {k: spec._replace(group=group) for k, spec in specs.items()}


def _shape_ok(got: tuple[int, ...], want: tuple[int | None, ...] | None) -> bool:
    if want is None:
        return True
    return len(got) == len(want) and all(
        w is None or g == w for g, w in zip(got, want, strict=True)
    )


def check_arrays(
    arrays: Mapping[str, np.ndarray],
    expected: Mapping[str, ArraySpec] | None,
    what: str = "message",
) -> None:
    """Raise WireError naming the first array that is missing, undeclared, or of another dtype
    or shape than declared. An array of a group may be missing only with its whole group.
    ``expected`` None: no declaration (the codec's checks only)."""
    if expected is None:
        return
    present = {spec.group for name, spec in expected.items() if name in arrays}
    for name, spec in expected.items():
        if name not in arrays:
            if spec.group is None:
                raise WireError(f"{what} is missing array {name!r}")
            if spec.group in present:
                raise WireError(
                    f"{what} is missing array {name!r} of group {spec.group!r}, which arrives whole"
                )
            continue
        a = arrays[name]
        if a.dtype != spec.dtype:
            raise WireError(
                f"{what}: array {name!r} has dtype {a.dtype}, expected {spec.describe()}"
            )
        if not _shape_ok(tuple(a.shape), spec.shape):
            raise WireError(
                f"{what}: array {name!r} has shape {tuple(a.shape)}, expected {spec.describe()}"
            )
    extra = sorted(set(arrays) - set(expected))
    if extra:
        raise WireError(f"{what} carries {len(extra)} undeclared array(s), first {extra[0]!r}")


@dataclass(frozen=True)
class Expectation:
    """What the receiver of a reply expects: the request it answers, and what its payload must
    be."""

    kind: str
    round: int
    device_id: str
    fleet: str
    tier: str
    run: str
    nonce: str
    algorithm: str
    arrays: Mapping[str, ArraySpec] | None = None
    max_samples: int | None = None  # the device's declared data size: num_samples may not exceed it
