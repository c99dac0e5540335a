"""Server optimizers: the one server-side step that turns a round's averaged weights into the new
global weights (Reddi et al., "Adaptive Federated Optimization", ICLR 2021, Algorithm 2).

Every method whose server averages model weights (FedAvg, FedProx, FedDW, HeteroFL and
HierarchyFL's layer-aligned averaging, Felo/Velo's averaging within an architecture) hands its
average to :meth:`ServerOptimizer.step` instead of installing it. With the round's pseudo-gradient
Δ = average − current (the mean update, the direction the devices moved):

    fedavg      x ← x + Δ                                   (plain averaging: the default)
    fedavgm     m ← β₁·m + Δ;            x ← x + η·m        (SGD with server momentum, Hsu et al.)
    fedadagrad  m ← β₁·m + (1−β₁)·Δ;     v ← v + Δ²
    fedyogi     m ← β₁·m + (1−β₁)·Δ;     v ← v − (1−β₂)·Δ²·sign(v − Δ²)
    fedadam     m ← β₁·m + (1−β₁)·Δ;     v ← β₂·v + (1−β₂)·Δ²
                (the three adaptive ones)              x ← x + η·m / (√v + τ)

element-wise, with m = 0 and v = τ² before the first step (the paper's v₋₁ ≥ τ²) and no bias
correction (the paper has none; Flower's FedAdam adds Adam's and starts v at 0). The paper's
defaults: β₁ = 0.9, β₂ = 0.99, τ = 1e-3; FedAvgM's momentum is β₁ (0.9) at η = 1. The server lr η
of each optimizer is chosen on a validation split over the paper's half-decade grid 10^{-3, -2.5, …}
(written 0.00316, 0.01, 0.0316, …; ``benchmarks/server_opt``); :data:`DEFAULT_LR` holds the chosen
values.

Only trainable parameters take the step; buffers (BatchNorm's running statistics and counters) are
not gradients and keep the plain average. Each method names its parameters (``trainable``).
State is kept per *group* (one global model: one group; Felo: one per architecture), and travels
in the method's checkpoints as arrays named ``opt|<group>|<m or v>|<tensor>``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

Name = Literal["fedavg", "fedavgm", "fedadagrad", "fedyogi", "fedadam"]
NAMES: tuple[str, ...] = ("fedavg", "fedavgm", "fedadagrad", "fedyogi", "fedadam")
#: Server lr η per optimizer when none is given: chosen by benchmarks/server_opt on a validation
#: split over the paper's grid (small CNN, Fashion-MNIST, Dir(0.5), 10 devices).
DEFAULT_LR: dict[str, float] = {
    "fedavg": 1.0,
    "fedavgm": 1.0,
    "fedadagrad": 0.0316,
    "fedyogi": 0.0316,
    "fedadam": 0.0316,
}
PREFIX = "opt|"


@dataclass(frozen=True)
class ServerOptSettings:
    """Which server optimizer and its hyperparameters (``lr`` None: the optimizer's default η)."""

    name: Name = "fedavg"
    lr: float | None = None
    beta1: float = 0.9  # FedAvgM's momentum; the first-moment decay of the adaptive ones
    beta2: float = 0.99  # second-moment decay (FedAdam, FedYogi)
    eps: float = 1e-3  # τ, the adaptivity: larger τ is closer to FedAvgM

    def __post_init__(self):
        if self.name not in NAMES:
            raise ValueError(f"server optimizer {self.name!r}: choose one of {', '.join(NAMES)}")
        if self.lr is not None and not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"server optimizer lr must be a finite number > 0 (got {self.lr})")
        for key, beta in (("beta1", self.beta1), ("beta2", self.beta2)):
            if not 0 <= beta < 1:
                raise ValueError(f"server optimizer {key} must be in [0, 1) (got {beta})")
        if not (self.eps > 0 and math.isfinite(self.eps)):
            raise ValueError(
                f"server optimizer eps (tau) must be a finite number > 0 (got {self.eps})"
            )

    @property
    def eta(self) -> float:
        return DEFAULT_LR[self.name] if self.lr is None else self.lr

    @property
    def averages_only(self) -> bool:
        """Plain averaging: the step installs the average unchanged."""
        return self.name == "fedavg" and self.eta == 1.0


class ServerOptimizer:
    """The step and its state (first and second moments per group and tensor)."""

    def __init__(self, settings: ServerOptSettings | None = None):
        self.settings = settings or ServerOptSettings()
        self.m: dict[str, dict[str, np.ndarray]] = {}
        self.v: dict[str, dict[str, np.ndarray]] = {}

    def step(
        self,
        group: str,
        current: Mapping[str, np.ndarray],
        averaged: Mapping[str, np.ndarray],
        trainable: Collection[str],
    ) -> dict[str, np.ndarray]:
        """The new weights of ``group`` from its ``current`` weights and the round's ``averaged``
        ones. Tensors in ``trainable`` (float) take the optimizer's step; every other tensor of
        ``averaged`` is installed as averaged. Dtypes and shapes are those of ``averaged``."""
        s = self.settings
        if s.averages_only:
            return dict(averaged)
        if "|" in group:
            raise ValueError(f"a server optimizer group name cannot hold '|' (got {group!r})")
        out = dict(averaged)
        m, v = self.m.setdefault(group, {}), self.v.setdefault(group, {})
        b1, b2, tau = s.beta1, s.beta2, s.eps
        for k, avg in averaged.items():
            avg = np.asarray(avg)
            if k not in trainable or avg.dtype.kind != "f":
                continue
            x = np.asarray(current[k], np.float64)
            if x.shape != avg.shape:
                raise ValueError(
                    f"server optimizer: {k} has shape {avg.shape} averaged but {x.shape} current"
                )
            delta = avg.astype(np.float64) - x
            if s.name in ("fedavg", "fedavgm"):
                if s.name == "fedavgm":
                    m[k] = mk = b1 * m.get(k, 0.0) + delta
                else:
                    mk = delta
                new = x + s.eta * mk
            else:
                m[k] = mk = b1 * m.get(k, 0.0) + (1 - b1) * delta
                vk = v.get(k, np.full_like(delta, tau * tau))
                sq = delta * delta
                if s.name == "fedadagrad":
                    vk = vk + sq
                elif s.name == "fedyogi":
                    vk = vk - (1 - b2) * sq * np.sign(vk - sq)
                else:  # fedadam
                    vk = b2 * vk + (1 - b2) * sq
                v[k] = vk
                new = x + s.eta * mk / (np.sqrt(vk) + tau)
            out[k] = new.astype(avg.dtype)
        return out

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        out = {}
        for slot, moments in (("m", self.m), ("v", self.v)):
            for group, arrays in moments.items():
                out.update({f"{PREFIX}{group}|{slot}|{k}": a for k, a in arrays.items()})
        return out

    def load_state_dict(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Restore the moments from a checkpoint's arrays (other arrays are ignored; a checkpoint
        without any, from a run without a server optimizer, leaves them empty)."""
        self.m, self.v = {}, {}
        for key, a in arrays.items():
            if not key.startswith(PREFIX):
                continue
            group, slot, name = key[len(PREFIX) :].split("|", 2)
            if slot not in ("m", "v"):
                raise ValueError(f"server optimizer state {key!r}: unknown slot {slot!r}")
            (self.m if slot == "m" else self.v).setdefault(group, {})[name] = np.array(
                a, np.float64
            )
