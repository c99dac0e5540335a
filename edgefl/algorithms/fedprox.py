"""FedProx (Li et al., 2020): FedAvg plus a proximal term μ/2·‖w − w_global‖² on the device."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from edgefl.algorithms.aggregate import Defences
from edgefl.algorithms.base import register
from edgefl.algorithms.fedavg import FEDAVG, GlobalModelDevice
from edgefl.privacy.trainer import PenalizedLoss
from edgefl.wire import Payload


@dataclass(frozen=True)
class Proximal:
    """The weight μ of the proximal term, mixed into the options of the methods that add the
    term (before an options class whose ``__post_init__`` checks the rest)."""

    mu: float = 0.01

    def __post_init__(self):
        super().__post_init__()
        if self.mu < 0:
            raise ValueError("mu must be >= 0")


@dataclass(frozen=True)
class FedProxOptions(Proximal, Defences):
    """μ and the aggregation defences."""


def proximal_term(model: torch.nn.Module, anchor: list[torch.Tensor]) -> torch.Tensor:
    return sum(((p - a) ** 2).sum() for p, a in zip(model.parameters(), anchor, strict=True))


class FedProxDevice(GlobalModelDevice):
    anchor: list[torch.Tensor] | None = None  # the received global weights (none before any)

    def receive(self, round: int, payload: Payload) -> None:
        super().receive(round, payload)
        self.anchor = [p.detach().clone() for p in self.model.parameters()]

    def loss_fn(self, round: int):
        mu = self.options.mu
        anchor = self.anchor or [p.detach().clone() for p in self.model.parameters()]
        # the penalty is of the weights alone: DP-SGD adds its gradient after the noise
        return PenalizedLoss(
            lambda x, y: F.cross_entropy(self.model(x), y),
            lambda: 0.5 * mu * proximal_term(self.model, anchor),
        )


#: FedAvg with the proximal term: FedAvg's server, defaults and needs, its own device and options.
register(replace(
    FEDAVG, name="fedprox", device=FedProxDevice, options=FedProxOptions,
    description="FedProx: FedAvg with a proximal term mu/2*||w - w_global||^2 in the local loss",
))
