"""`ModelSpec`: the frozen, JSON-safe description of one model of the zoo.

A spec travels on the wire and in ONNX metadata, so it holds only plain values
(str, int, float, tuples of those) and round-trips exactly through `to_dict`/`from_dict`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from edgefl.errors import ConfigError, check_fields

HEADS = ("linear", "feddw", "mlp")


@dataclass(frozen=True)
class ModelSpec:
    """What to build: a family, one of its tiers, and the task it is built for.

    - `in_shape`: (C, H, W) of the input images, which are in [0, 1].
    - `width`: channel multiplier applied by the family (CPU-sized runs use 0.25 or less).
    - `feature_dim`: None keeps the family's natural feature dimension; an int appends a
      projection Linear(natural, feature_dim) to the extractor, so that methods exchanging
      features can share one dimension across architectures.
    - `head`: "linear" (one Linear classifier), "feddw" (fc 256 → fc 128 → bias-free classifier) or
      "mlp" (the same fc layers, classifier with bias: FedDW's baselines).
    - `mean`/`std`: per-channel normalization (one value broadcasts) applied inside the model.
    - `options`: family-specific extras as sorted (key, value) string pairs, e.g.
      `(("stem", "imagenet"),)`; a mapping is accepted and converted.
    """

    family: str
    tier: str
    num_classes: int
    in_shape: tuple[int, int, int]
    width: float = 1.0
    feature_dim: int | None = None
    head: str = "linear"
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    options: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        # Normalise types so that equal specs compare (and hash) equal whatever the caller
        # passed (lists from JSON, ints for floats, a dict of options).
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        try:
            put("family", str(self.family))
            put("tier", str(self.tier))
            put("num_classes", _as_int(self.num_classes, "num_classes"))
            put("in_shape", tuple(_as_int(v, "in_shape") for v in self.in_shape))
            put("width", float(self.width))
            if self.feature_dim is not None:
                put("feature_dim", _as_int(self.feature_dim, "feature_dim"))
            put("head", str(self.head))
            put("mean", tuple(float(v) for v in self.mean))
            put("std", tuple(float(v) for v in self.std))
            put("options", _as_options(self.options))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"invalid model spec: {exc}") from None
        self._check()

    def _check(self) -> None:
        if len(self.in_shape) != 3 or min(self.in_shape) < 1:
            raise ConfigError(f"in_shape must be (C, H, W) of positive ints, got {self.in_shape}")
        if self.num_classes < 1:
            raise ConfigError(f"num_classes must be at least 1, got {self.num_classes}")
        if not (math.isfinite(self.width) and self.width > 0):
            raise ConfigError(f"width must be a positive number, got {self.width}")
        if self.feature_dim is not None and self.feature_dim < 1:
            raise ConfigError(f"feature_dim must be None or positive, got {self.feature_dim}")
        if self.head not in HEADS:
            raise ConfigError(f"unknown head {self.head!r}; choose one of: {', '.join(HEADS)}")
        channels = self.in_shape[0]
        for name in ("mean", "std"):
            values = getattr(self, name)
            if len(values) not in (1, channels):
                raise ConfigError(
                    f"{name} needs 1 or {channels} values for in_shape {self.in_shape}, "
                    f"got {len(values)}"
                )
            if not all(math.isfinite(v) for v in values):
                raise ConfigError(f"{name} must be finite, got {values}")
        if min(self.std) <= 0:
            raise ConfigError(f"std must be positive, got {self.std}")

    # --- options -------------------------------------------------------------------------

    def option(self, key: str, default: str | None = None) -> str | None:
        """The value of a family option, or `default` when the spec does not set it."""
        return dict(self.options).get(key, default)

    # --- identity and (de)serialisation ----------------------------------------------------

    @property
    def name(self) -> str:
        """A readable id such as "resnet18-w0.25" or "hierarchy-width-1_8-d128-feddw"."""
        joiner = "" if self.tier.isdigit() and "-" not in self.family else "-"
        parts = [f"{self.family}{joiner}{self.tier.replace('/', '_')}"]
        parts += [f"{key}={value}" for key, value in self.options if key != "arch"]
        if self.width != 1.0:
            parts.append(f"w{self.width:g}")
        if self.feature_dim is not None:
            parts.append(f"d{self.feature_dim}")
        if self.head != "linear":
            parts.append(self.head)
        return "-".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (lists for tuples); `ModelSpec.from_dict` inverts it exactly."""
        return {
            "family": self.family,
            "tier": self.tier,
            "num_classes": self.num_classes,
            "in_shape": list(self.in_shape),
            "width": self.width,
            "feature_dim": self.feature_dim,
            "head": self.head,
            "mean": list(self.mean),
            "std": list(self.std),
            "options": [[key, value] for key, value in self.options],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelSpec:
        """Rebuild a spec from `to_dict` output (also after a JSON round trip)."""
        check_fields(data, (f.name for f in fields(cls)), _REQUIRED, "model spec")
        return cls(**dict(data))


_REQUIRED = ("family", "tier", "num_classes", "in_shape")


def _as_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or int(value) != value:
        raise ValueError(f"{what} must hold integers, got {value!r}")
    return int(value)


def _as_options(
    options: Mapping[str, str] | Iterable[Iterable[str]],
) -> tuple[tuple[str, str], ...]:
    pairs = options.items() if isinstance(options, Mapping) else options
    result: dict[str, str] = {}
    for pair in pairs:
        if isinstance(pair, str):
            raise ValueError(f"options must be (key, value) pairs, got {pair!r}")
        key, value = (str(v) for v in pair)
        if key in result:
            raise ValueError(f"option {key!r} is given twice")
        result[key] = value
    return tuple(sorted(result.items()))
