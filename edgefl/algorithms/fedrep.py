"""FedRep (Collins et al., 2021): a shared representation, a personal head on every device.

The model splits into the *body* (everything up to the features, ``model.features``) and the
*head* (the last linear layer, ``model.classifier``). Each round a device

1. trains its head for ``head_epochs`` epochs with the body frozen, then
2. trains the body for the run's local work (``--epochs``/``--steps``) with the head frozen,

and sends the body alone. The server averages the bodies (weighted by data size, through the
run's ``--server-opt`` step, as FedAvg) and sends the average back; the device installs it under
its own head. The head never leaves the device: it is on no message, and the model a device ends
with (the one evaluated, on its own test distribution in benchmarks/fedhenn) is the shared body
with its personal head.

Options (``-o key=value``): ``head_epochs=10`` (the FedRep paper's and code's 10 local epochs of
head updates to 1 of the representation, ``--local_ep 10 --local_rep_ep 1``; the body's epochs
are the run's ``--epochs``, default 1). One architecture: every device the same tier (the paper
shares the whole representation).

Our choice (the paper's code freezes the body by ``requires_grad`` and keeps train mode): the
head trains on the frozen body's features computed once per round in eval mode, which is the
same function of the head's weights but for dropout (off), at the cost of one forward pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from edgefl.algorithms.aggregate import Defences
from edgefl.algorithms.base import Algorithm, MethodNeeds, register
from edgefl.algorithms.fedavg import (
    PAPER_DEFAULTS,
    WEIGHTS,
    GlobalModelDevice,
    GlobalModelServer,
)
from edgefl.algorithms.training import make_optimizer, optimizer_step, train_local
from edgefl.privacy import Release
from edgefl.wire import ArraySpec, Payload, arrays_to_state, state_to_arrays

HEAD = "classifier."  # the personal head: the model's last linear layer (edgefl.models.base)


def is_head(name: str) -> bool:
    """Whether a state-dict name (with or without the wire prefix) belongs to the head."""
    return name.removeprefix(WEIGHTS).startswith(HEAD)


@dataclass(frozen=True)
class FedRepOptions(Defences):
    """The head's epochs per round, and the aggregation defences (as FedAvg's)."""

    head_epochs: int = 10

    def __post_init__(self):
        super().__post_init__()
        if self.head_epochs < 0:
            raise ValueError("head_epochs must be >= 0")


class FedRepDevice(GlobalModelDevice):
    """Receives the averaged body, trains its head then its body, sends the body."""

    dp_sgd_ready = False  # two training phases a round, one of them on the head alone

    def body_state(self) -> dict[str, np.ndarray]:
        return {
            k: v
            for k, v in state_to_arrays(self.model.state_dict(), WEIGHTS).items()
            if not is_head(k)
        }

    def receive(self, round: int, payload: Payload) -> None:
        state = arrays_to_state(payload.arrays, WEIGHTS)
        if not state:
            return
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        wrong = [k for k in missing if not is_head(k)] + list(unexpected)
        if wrong or any(is_head(k) for k in state):
            raise ValueError(f"fedrep downlink must carry exactly the body: {sorted(wrong)[:3]}")

    def expected_downlink(self) -> dict[str, ArraySpec]:
        """The shared body's weights; the head is never sent."""
        return {k: s for k, s in self.weight_specs(WEIGHTS).items() if not is_head(k)}

    @classmethod
    def privacy_release(cls, options) -> Release:
        """The trained body, clipped as one update from the body received."""
        return Release(whole=(WEIGHTS,))

    def train_head(self, round: int) -> dict[str, float]:
        """``head_epochs`` epochs of the head on the frozen body's features of the device's data."""
        epochs = self.options.head_epochs
        data = self.ctx.train_data
        if epochs == 0 or len(data) == 0:
            return {}
        self.model.eval()
        with torch.no_grad():
            feats, labels = zip(
                *((self.model.features(x), y) for x, y in data.batches(1000, shuffle=False)),
                strict=True,
            )
        feats, labels = torch.cat(feats), torch.cat(labels)
        self.model.train()
        head = self.model.classifier
        opt = make_optimizer(head.parameters(), self.ctx.settings, round)
        rng = self.ctx.rng(round, stream=1)
        size, total, seen = self.ctx.settings.batch_size, 0.0, 0
        for _ in range(epochs):
            order = torch.from_numpy(rng.permutation(len(labels))).to(feats.device)
            for start in range(0, len(order), size):
                idx = order[start : start + size]
                opt.zero_grad(set_to_none=True)
                loss = F.cross_entropy(head(feats[idx]), labels[idx])
                loss.backward()
                optimizer_step(opt, self.ctx.settings)
                total += float(loss.detach()) * len(idx)
                seen += len(idx)
        opt.zero_grad(set_to_none=True)
        return {"head_loss": total / max(seen, 1)}

    def fit(self, round: int) -> Payload:
        head_metrics = self.train_head(round)
        head = list(self.model.classifier.parameters())
        body = [p for n, p in self.model.named_parameters() if not is_head(n)]
        for p in head:
            p.requires_grad_(False)
        try:
            ctx = self.ctx
            stats = train_local(
                self.model, ctx.train_data, ctx.settings, round, ctx.rng(round), params=body
            )
        finally:
            for p in head:
                p.requires_grad_(True)
        meta = {"num_samples": len(self.ctx.train_data), **stats, **head_metrics}
        return Payload(self.body_state(), meta)


class FedRepServer(GlobalModelServer):
    """FedAvg's server over the body alone: it never holds, sends or accepts a head."""

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.weights = {k: v for k, v in self.weights.items() if not is_head(k)}
        self.trainable = frozenset(k for k in self.trainable if not is_head(k))

    def load_state_dict(self, arrays: Mapping[str, np.ndarray]) -> None:
        super().load_state_dict({k: v for k, v in arrays.items() if not is_head(k)})


register(
    Algorithm(
        name="fedrep",
        description="FedRep: average a shared body; every device keeps and trains its own head "
        "(head epochs, then the body)",
        device=FedRepDevice,
        server=FedRepServer,
        options=FedRepOptions,
        defaults=PAPER_DEFAULTS,  # FedAvg's CNN and recipe
        needs=MethodNeeds(averages_weights=True),
    )
)
