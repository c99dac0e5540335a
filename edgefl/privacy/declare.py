"""What a method's uplink reveals, declared once per device half, and a run's privacy settings.

A device half declares its uplink with :class:`Release` (``DeviceHalf.privacy_release(options)``,
a classmethod: the server reads the same declaration). Two kinds of protected part:

``whole``  arrays released as one vector (model weights, weight deltas, FedHeNN's representation
           matrix): their distance from a reference (the arrays of the same names that the device
           last received, or zero) is clipped to L2 norm C, and Gaussian noise is added. The unit
           protected is the device's whole dataset: any two datasets give releases at most 2C apart.
``stats``  per-class statistics of the device's samples (:class:`ClassStats`): each sample's
           vector (the concatenation of its rows in every block) is clipped to C before the
           per-class sums, whose noisy values the uplink then carries (sums or sum / noisy count),
           with noisy counts. The unit protected is one sample: replacing one sample moves the
           sums by at most 2C and the counts by at most √2 (scaled by C: 2 in all).

Every protected part is a Gaussian mechanism with L2 sensitivity 2C in its units, noised with
standard deviation ``z·2C``: one event of noise multiplier ``z`` for the accountant. The number
of samples a device holds is public (a device registers it), hence replace-one neighbours.

Integer arrays inside a ``whole`` part (BatchNorm's ``num_batches_tracked``) are kept: they
count local steps, a function of the round and of the public dataset size.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from edgefl.errors import ConfigError, EdgeflError


class PrivacyBudgetSpent(EdgeflError):
    """A device asked to release more than its privacy budget allows."""


#: Sensitivity of every protected part, in units of the clip bound C (see the module doc).
SENSITIVITY = 2.0


@dataclass(frozen=True)
class ClassStats:
    """Per-class statistics of the device's own samples in an uplink.

    ``blocks``: uplink arrays whose rows are classes (dense: [C, d]; with ``classes``: the rows of
    the classes listed there). Their per-sample vectors come from the device half's
    ``sample_vectors(x)`` ({block: [B, d]}), computed in eval mode over the device's training data,
    each sample once. ``reduce``: the uplink carries per-class sums or means. ``counts``: the
    uplink array of per-class counts ([C]; None if the method sends none). ``classes``: the uplink
    array naming each row's class (None: dense rows).
    """

    blocks: tuple[str, ...]
    reduce: Literal["mean", "sum"] = "mean"
    counts: str | None = None
    classes: str | None = None

    def __post_init__(self):
        if not self.blocks:
            raise ValueError("ClassStats needs at least one block")
        if self.reduce not in ("mean", "sum"):
            raise ValueError("reduce must be mean or sum")


@dataclass(frozen=True)
class Release:
    """A device half's declaration of its uplink (see the module doc).

    ``whole``: array names and prefixes (ending in ``/``) released as one clipped vector;
    ``reference``: ``received`` (the same names in the device's last downlink; zero for a name it
    did not receive) or ``zero``. ``stats``: per-class statistics. ``unprotected``: arrays no
    mechanism here bounds, with ``reason``: differential privacy refuses such a method.
    An empty Release (nothing uplinked) is private by construction.
    """

    whole: tuple[str, ...] = ()
    reference: Literal["received", "zero"] = "received"
    stats: ClassStats | None = None
    unprotected: tuple[str, ...] = ()
    reason: str = ""

    def __post_init__(self):
        if self.unprotected and not self.reason:
            raise ValueError("a Release with unprotected arrays says why (reason)")
        if self.reference not in ("received", "zero"):
            raise ValueError("reference must be received or zero")

    @property
    def parts(self) -> int:
        """Gaussian mechanisms one uplink composes (each with noise multiplier z)."""
        return int(bool(self.whole)) + int(self.stats is not None)

    def in_whole(self, name: str) -> bool:
        return _named(name, self.whole)

    def declares(self, name: str) -> bool:
        """Whether the declaration names uplink array ``name`` (protected or not)."""
        return self.covers(name) or _named(name, self.unprotected)

    def stat_arrays(self) -> set[str]:
        if self.stats is None:
            return set()
        s = self.stats
        return set(s.blocks) | {a for a in (s.counts, s.classes) if a}

    def covers(self, name: str) -> bool:
        """Whether a mechanism of this declaration protects uplink array ``name``."""
        return self.in_whole(name) or name in self.stat_arrays()


def _named(name: str, names: tuple[str, ...]) -> bool:
    """``name`` is one of ``names`` or under one of its prefixes (a name ending in ``/``)."""
    return any(name == n or (n.endswith("/") and name.startswith(n)) for n in names)


Mode = Literal["off", "local", "central", "sgd"]

#: The method options that carry the privacy settings (``-o dp=local``, the CLI's ``--dp``).
OPTION_KEYS = {
    "dp": "mode",
    "dp_target_epsilon": "target_epsilon",
    "dp_delta": "delta",
    "dp_clip": "clip",
    "dp_noise_multiplier": "noise_multiplier",
    "dp_adaptive_quantile": "adaptive_quantile",
}


@dataclass(frozen=True)
class PrivacySettings:
    """A run's differential privacy: ``mode`` local (each device clips and noises its uplink),
    central (the server clips each device's update and noises the sum) or sgd (each device trains
    with DP-SGD: per-sample gradients clipped to ``clip`` and noised; edgefl.privacy.dpsgd), a budget
    ``target_epsilon`` at ``delta`` per device, the clip bound ``clip`` and, optionally, the noise
    multiplier (default: the smallest that keeps every device within the budget over the whole
    run). ``adaptive_quantile`` > 0 (central only): the clip bound follows that quantile of the
    update norms (Andrew et al., 2021), starting from ``clip``."""

    mode: Mode = "off"
    target_epsilon: float = math.inf
    delta: float = 1e-5
    clip: float = 1.0
    noise_multiplier: float | None = None
    adaptive_quantile: float = 0.0

    def __post_init__(self):
        if self.mode not in ("off", "local", "central", "sgd"):
            raise ConfigError(f"dp={self.mode!r}: choose off, local, central or sgd")
        if not self.target_epsilon > 0:
            raise ConfigError(f"dp_target_epsilon must be > 0 (got {self.target_epsilon})")
        if not 0 < self.delta < 1:
            raise ConfigError(f"dp_delta must be in (0, 1) (got {self.delta})")
        if not (self.clip > 0 and math.isfinite(self.clip)):
            raise ConfigError(f"dp_clip must be a finite number > 0 (got {self.clip})")
        if self.noise_multiplier is not None and not (self.noise_multiplier > 0 and math.isfinite(self.noise_multiplier)):
            raise ConfigError(f"dp_noise_multiplier must be a finite number > 0 (got {self.noise_multiplier})")
        if not 0 <= self.adaptive_quantile < 1:
            raise ConfigError(f"dp_adaptive_quantile must be in [0, 1) (got {self.adaptive_quantile})")
        if self.adaptive_quantile and self.mode != "central":
            raise ConfigError("dp_adaptive_quantile needs dp=central (the server sees the update norms it adapts to)")
        if self.mode != "off" and math.isinf(self.target_epsilon) and self.noise_multiplier is None:
            raise ConfigError("differential privacy needs a budget (--target-epsilon) or a noise multiplier (--noise-multiplier)")

    @property
    def on(self) -> bool:
        return self.mode != "off"

    @property
    def on_device(self) -> bool:
        """Local DP: each device protects its own uplink."""
        return self.mode == "local"

    @property
    def trains_privately(self) -> bool:
        """DP-SGD: each device's local training is differentially private (dp=sgd)."""
        return self.mode == "sgd"

    def as_options(self) -> dict[str, str]:
        """The method options that give these settings back (an assignment carries them)."""
        if not self.on:
            return {}
        out = {"dp": self.mode, "dp_target_epsilon": str(self.target_epsilon), "dp_delta": str(self.delta), "dp_clip": str(self.clip)}
        if self.noise_multiplier is not None:
            out["dp_noise_multiplier"] = str(self.noise_multiplier)
        if self.adaptive_quantile:
            out["dp_adaptive_quantile"] = str(self.adaptive_quantile)
        return out


def split_privacy_options(raw: Mapping[str, object]) -> tuple[dict[str, object], PrivacySettings]:
    """(the method's own options, the privacy settings) from a method's raw options."""
    own = {k: v for k, v in raw.items() if k not in OPTION_KEYS}
    values: dict[str, object] = {}
    for key, name in OPTION_KEYS.items():
        if key not in raw:
            continue
        value = raw[key]
        if name == "mode":
            values[name] = str(value).strip().lower()
            continue
        text = str(value).strip().lower()
        if name == "noise_multiplier" and text in ("", "none"):
            continue
        try:
            values[name] = math.inf if text in ("inf", "infinity") else float(text)
        except ValueError:
            raise ConfigError(f"option {key}={value!r} is not a number") from None
    return own, PrivacySettings(**values)
