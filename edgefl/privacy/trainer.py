"""The hook through which DP-SGD (:mod:`edgefl.privacy.dpsgd`) takes over a device's local
training, with no change to the methods: :func:`edgefl.algorithms.training.train_local` hands its
work to the trainer set here, if any, for the duration of one device's ``fit``.

Kept free of heavy imports: the algorithms import it on every device.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PenalizedLoss:
    """A local objective in two parts: ``data(x, y)``, the mean over the batch of each sample's
    loss, and ``penalty()``, a term of the weights and public values alone (FedProx's proximal
    term). Called, it is their sum; DP-SGD clips and noises each sample's gradient of ``data``
    and adds the gradient of ``penalty``, which reveals nothing of the data, after the noise."""

    data: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    penalty: Callable[[], torch.Tensor]

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.data(x, y) + self.penalty()


#: trainer(model, data, settings, round, loss_fn, optimizer) -> metrics; None: train_local's loop
Trainer = Callable[..., dict[str, float]]

_TRAINER: ContextVar[Trainer | None] = ContextVar("edgefl_local_trainer", default=None)


def active_trainer() -> Trainer | None:
    """The trainer that replaces train_local's loop in this context (None: the plain loop)."""
    return _TRAINER.get()


@contextmanager
def local_trainer(trainer: Trainer) -> Iterator[None]:
    """Within the block, train_local hands every round of local training to ``trainer``."""
    token = _TRAINER.set(trainer)
    try:
        yield
    finally:
        _TRAINER.reset(token)
