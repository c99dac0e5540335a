"""Privacy accounting with Google's ``dp-accounting`` library (Rényi DP of the Gaussian mechanism).

Every protected part of an uplink is one Gaussian mechanism of noise multiplier ``z``
(:mod:`edgefl.privacy.declare`); a device's loss over a run is the RDP composition of the
mechanisms it has run, converted to (ε, δ). No amplification by sampling is claimed: a round's
devices are a fixed-size draw the server knows, and the statistics a device sends cover all of its
samples, so neither is the secret Poisson or uniform subsample the amplification theorems assume
(docs/privacy.md). The ε reported is therefore an upper bound for every device.
"""

from __future__ import annotations

import math
from functools import lru_cache

import dp_accounting  # the [privacy] install layer (edgefl.errors.EXTRA_OF_MODULE names it)
from dp_accounting import rdp

from edgefl.errors import ConfigError


@lru_cache(maxsize=4096)
def epsilon_of(noise_multiplier: float, count: int, delta: float) -> float:
    """ε at ``delta`` of ``count`` Gaussian mechanisms of noise multiplier ``noise_multiplier``."""
    if count <= 0:
        return 0.0
    accountant = rdp.RdpAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(noise_multiplier), count)
    return float(accountant.get_epsilon(delta))


def calibrate_noise(target_epsilon: float, delta: float, count: int) -> float:
    """The smallest noise multiplier whose ``count``-fold composition stays within
    ``target_epsilon`` at ``delta`` (the library's own calibration, by bisection)."""
    if count <= 0:
        raise ConfigError("nothing to calibrate: the run releases nothing")
    if math.isinf(target_epsilon):
        raise ConfigError(
            "an infinite budget needs no noise; give a noise multiplier or a finite "
            "--target-epsilon")
    z = dp_accounting.calibrate_dp_mechanism(
        rdp.RdpAccountant,
        lambda z: dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), count),
        target_epsilon,
        delta,
        bracket_interval=dp_accounting.LowerEndpointAndGuess(1e-3, 1.0),
        tol=1e-4,
    )
    return float(z)


def adaptive_update_noise(noise_multiplier: float, count_std: float) -> float:
    """Andrew et al. (2021), Thm. 1: with the clipped-count sum noised at ``count_std``, the
    update's sum noised at multiplier z_Δ gives one Gaussian mechanism of multiplier
    ``noise_multiplier`` = (z_Δ⁻² + (2·count_std)⁻²)^(-1/2). Returns z_Δ."""
    rest = noise_multiplier**-2 - (2 * count_std) ** -2
    if rest <= 0:
        raise ConfigError(
            f"adaptive clipping: the count noise ({count_std:.3g}) must exceed half the noise "
            f"multiplier ({noise_multiplier:.3g}); "
            "select more devices per round or use a fixed clip"
        )
    return rest**-0.5


class Ledger:
    """Per device, the Gaussian mechanisms composed so far, against a budget ``target_epsilon``."""

    def __init__(self, noise_multiplier: float, delta: float, target_epsilon: float):
        self.noise_multiplier, self.delta, self.target_epsilon = (
            noise_multiplier, delta, target_epsilon)
        self.counts: dict[str, int] = {}

    def epsilon(self, device_id: str, extra: int = 0) -> float:
        """ε spent by ``device_id`` so far (after ``extra`` more mechanisms)."""
        return epsilon_of(self.noise_multiplier, self.counts.get(device_id, 0) + extra, self.delta)

    def can_spend(self, device_id: str, count: int) -> bool:
        """Whether ``count`` more mechanisms keep the device within its budget."""
        return self.epsilon(device_id, count) <= self.target_epsilon * (1 + 1e-9)

    def spend(self, device_id: str, count: int) -> float:
        self.counts[device_id] = self.counts.get(device_id, 0) + count
        return self.epsilon(device_id)

    def state(self) -> dict[str, int]:
        return dict(self.counts)
