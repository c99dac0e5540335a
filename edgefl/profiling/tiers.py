"""The one tier policy: the largest tier of a family whose estimated training memory and round
time fit a device's budget (:func:`choose_tier`)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgefl.errors import ConfigError
from edgefl.profiling.measurement import (
    OPTIMIZER_STATES,
    estimate_round_seconds,
    estimate_training_memory_mb,
)
from edgefl.profiling.profile import DeviceProfile

if TYPE_CHECKING:
    from edgefl.models import ModelSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TierBudget:
    """How much of a device one round of training may use.

    - ``memory_fraction``: share of the device's available memory (RAM; a discrete CUDA GPU's
      memory where the profile has one) the estimated training memory may take.
    - ``round_seconds``: the local-work time limit per round; None: no time limit.
    - ``batch_size``/``optimizer``: what training uses (memory estimate).
    - ``samples_per_round``: samples trained per round (epochs × shard size, or steps × batch).
    """

    memory_fraction: float = 0.5
    round_seconds: float | None = None
    batch_size: int = 32
    samples_per_round: int = 1000
    optimizer: str = "sgd-momentum"

    def __post_init__(self) -> None:
        if not 0 < self.memory_fraction <= 1:
            raise ConfigError(f"memory_fraction must be in (0, 1], got {self.memory_fraction}")
        if self.round_seconds is not None and self.round_seconds <= 0:
            raise ConfigError(f"round_seconds must be > 0 or None, got {self.round_seconds}")
        if self.batch_size < 1 or self.samples_per_round < 1:
            raise ConfigError("batch_size and samples_per_round must be >= 1")
        if self.optimizer not in OPTIMIZER_STATES:
            raise ConfigError(
                f"unknown optimizer {self.optimizer!r}; choose one of: "
                f"{', '.join(OPTIMIZER_STATES)}"
            )


def memory_budget_mb(profile: DeviceProfile, budget: TierBudget) -> float:
    memory = profile.ram_available_mb
    if profile.kind == "cuda-host" and profile.accelerator_memory_mb:
        memory = profile.accelerator_memory_mb  # a discrete GPU trains in its own memory
    return budget.memory_fraction * memory


@dataclass(frozen=True)
class TierEstimate:
    tier: str
    memory_mb: float
    round_seconds: float
    fits_memory: bool
    fits_time: bool

    @property
    def fits(self) -> bool:
        return self.fits_memory and self.fits_time


def estimate_tiers(
    profile: DeviceProfile, spec_template: ModelSpec, tiers: list[str], budget: TierBudget
) -> list[TierEstimate]:
    """Memory and round-time estimates of every tier on ``profile`` and whether each fits."""
    limit = memory_budget_mb(profile, budget)
    out = []
    for tier in tiers:
        spec = dataclasses.replace(spec_template, tier=tier)
        memory = estimate_training_memory_mb(spec, budget.batch_size, budget.optimizer)
        seconds = estimate_round_seconds(spec, profile, budget.samples_per_round)
        fits_time = budget.round_seconds is None or seconds <= budget.round_seconds
        out.append(TierEstimate(tier, memory, seconds, memory <= limit, fits_time))
    return out


def choose_tier(
    profile: DeviceProfile,
    spec_template: ModelSpec,
    tiers: list[str],
    budget: TierBudget | None = None,
    *,
    strict: bool = False,
) -> str:
    """The largest of ``tiers`` (ordered small → large) that fits ``budget`` on ``profile``.

    If none fits: the smallest tier with a logged warning, or ConfigError when ``strict``.
    """
    if not tiers:
        raise ConfigError("choose_tier needs at least one tier")
    budget = budget or TierBudget()
    estimates = estimate_tiers(profile, spec_template, tiers, budget)
    fitting = [e.tier for e in estimates if e.fits]
    if fitting:
        return fitting[-1]
    smallest = estimates[0]
    why = (
        f"needs ~{smallest.memory_mb:.0f} MiB of {memory_budget_mb(profile, budget):.0f} MiB "
        "allowed"
        if not smallest.fits_memory
        else f"needs ~{smallest.round_seconds:.1f} s per round, limit {budget.round_seconds} s"
    )
    message = (
        f"no tier of {spec_template.family} fits device {profile.name!r}: the smallest "
        f"({smallest.tier}) {why}"
    )
    if strict:
        raise ConfigError(message)
    log.warning("%s; using it anyway", message)
    return smallest.tier
