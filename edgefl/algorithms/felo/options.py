"""The options of FedHe, Felo and Velo (:mod:`edgefl.algorithms.felo`), one type per method, each
extending the one before; what each choice does: docs/methods/felo.md."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from edgefl.algorithms.aggregate import Defences

#: The wire prefix of the architecture's weights Felo and Velo exchange.
WEIGHTS = "w/"


@dataclass(frozen=True)
class FedHeOptions(Defences):
    alpha: float = 0.5  # weight of the distillation terms
    warmup_fraction: float = 0.05  # CE only for the first ceil(fraction·rounds) rounds
    history: int = 100  # (device, round) class means kept per class by the server
    temperature: float = 1.0  # KL temperature

    def __post_init__(self):
        super().__post_init__()
        if self.alpha < 0:
            raise ValueError("alpha must be >= 0")
        if not 0 <= self.warmup_fraction < 1:
            raise ValueError("warmup_fraction must be in [0, 1)")
        if self.history < 1:
            raise ValueError("history must be >= 1")
        if self.temperature <= 0:
            raise ValueError("temperature must be > 0")

    @property
    def shares_weights(self) -> bool:
        return False

    def warmup_rounds(self, rounds: int) -> int:
        return math.ceil(self.warmup_fraction * rounds - 1e-9)


@dataclass(frozen=True)
class FeloOptions(FedHeOptions):
    average_weights: bool = True  # FedAvg within each architecture (the paper's step 5)
    # BatchNorm running statistics of the averaged weights a device receives: "average" (the mean
    # of the devices' statistics, as the paper's FedAvg sends them) or "recalibrate" (re-estimated
    # by the device on its own training data: averaged weights do not produce averaged statistics)
    bn_stats: Literal["average", "recalibrate"] = "average"
    # Weight of a cross-entropy term that trains the classifier on the server's per-class features
    # (Felo's averages, Velo's CVAE samples), one per known class, every step: a head calibrated
    # for classes the device has few or no images of. 0 = off, the paper (a departure of ours).
    server_feature_ce: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        if self.server_feature_ce < 0:
            raise ValueError("server_feature_ce must be >= 0")

    @property
    def shares_weights(self) -> bool:
        return self.average_weights


@dataclass(frozen=True)
class VeloOptions(FeloOptions):
    cvae_interval: int = 1  # train the CVAE every this many rounds
    cvae_epochs: int = 10
    cvae_batch: int = 50
    cvae_lr: float = 1e-3
    cvae_buffer: int = 500  # feature points kept per class for CVAE training
    feature_upload: Literal["batch-means", "samples"] = "batch-means"
    points_per_class: int = 50  # at most this many uploaded points per class and round

    def __post_init__(self):
        super().__post_init__()
        counts = {
            "cvae_interval": self.cvae_interval,
            "cvae_epochs": self.cvae_epochs,
            "cvae_batch": self.cvae_batch,
            "cvae_buffer": self.cvae_buffer,
            "points_per_class": self.points_per_class,
        }
        for name, value in counts.items():
            if value < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.cvae_lr <= 0:
            raise ValueError("cvae_lr must be > 0")
