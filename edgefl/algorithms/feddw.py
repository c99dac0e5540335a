"""FedDW (Liu et al.): keep the classifier's class relations consistent with the global soft labels.

The model is any extractor with ``head="feddw"`` (fc 256 → fc 128 → bias-free classifier W, C×128).

Device (each minibatch)::

    L = CE + λ_t · R,   R = (1/C²)·‖S − rowsoftmax(W·Wᵀ)‖²_F

R depends on W only, so only the classifier gets its gradient. After local training one eval-mode
pass over the local training set sums softmax(logits / T) per true class; the uplink is the
weights, those C×C sums and the C class counts (sums, not means: the server weighs classes by
their counts exactly).

Server: FedAvg weighted by data size (reused from :mod:`edgefl.algorithms.fedavg`), and the
soft-label (SL) matrix::

    S_new[y] = Σ_k sums_k[y] / Σ_k counts_k[y]       (a class nobody holds: the one-hot row e_y)
    S ← sl_momentum·S_prev + (1 − sl_momentum)·S_new,  S_0 = I_C

Options (``-o key=value``), defaults and where they come from:

- ``lam``: the weight of R, chosen by ``benchmarks/feddw``'s sweep over {0.1, 1, 10, 100} on a
  validation split (the paper tunes λ over {0.01 … 100} without naming the winner; the earlier
  0.1 gave R about 5e-4 of CE's gradient, so FedDW trained as FedAvg).
  ``lam_decay_rounds`` (default none) and ``lam_gamma=0.1``: the authors' code divides λ by 10
  at rounds 9, 18, 27, 36, 45 (``lam_decay_rounds=9,18,27,36,45`` restores it).
- ``sl_momentum=0.5``: the paper's/code's 0.5·S_new + 0.5·S_prev.
- ``cumulative=false``: per-round S_new (our default). ``true`` reproduces the code's quirk of
  never clearing the report lists, so S_new averages every report since round 0.
- ``missing_class=onehot``: the spec's rule for a class no device reported this round; ``keep``
  keeps that row of the previous S instead (the toolkit's general straggler rule).
- ``temperature=1``: soft-label temperature (spec default).

``fedprox-dw`` is the paper's compatibility combination: FedProx's proximal term plus the DW
regulariser (options of both: ``mu`` and the above).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from edgefl.algorithms.base import Algorithm, MethodNeeds, register
from edgefl.algorithms.fedavg import WEIGHTS, GlobalModelDevice, GlobalModelServer
from edgefl.algorithms.fedprox import FedProxDevice, Proximal
from edgefl.privacy import ClassStats, Release
from edgefl.wire import ArraySpec, Payload, array_spec

log = logging.getLogger(__name__)

SL = "sl"  # downlink: the global soft-label matrix S (C×C)
SL_SUMS = "sl_sums"  # uplink: per-class sums of softmax outputs (C×C)
SL_COUNTS = "sl_counts"  # uplink: per-class sample counts (C)


@dataclass(frozen=True)
class FedDWOptions:
    lam: float = 100.0  # chosen by benchmarks/feddw's sweep over {0.1, 1, 10, 100}
    lam_decay_rounds: tuple[int, ...] = ()  # the authors' code: 9, 18, 27, 36, 45
    lam_gamma: float = 0.1
    sl_momentum: float = 0.5
    cumulative: bool = False
    missing_class: Literal["onehot", "keep"] = "onehot"
    temperature: float = 1.0

    def __post_init__(self):
        if self.lam < 0:
            raise ValueError("lam must be >= 0")
        if not 0 <= self.sl_momentum < 1:
            raise ValueError("sl_momentum must be in [0, 1)")
        if self.temperature <= 0:
            raise ValueError("temperature must be > 0")
        if self.lam_gamma < 0:
            raise ValueError("lam_gamma must be >= 0")

    def lam_at(self, round: int) -> float:
        return self.lam * self.lam_gamma ** sum(round >= r for r in self.lam_decay_rounds)


@dataclass(frozen=True)
class FedProxDWOptions(Proximal, FedDWOptions):
    """FedDW's options and FedProx's μ."""


def class_relation(weight: torch.Tensor) -> torch.Tensor:
    """The CR matrix rowsoftmax(W·Wᵀ) of a bias-free classifier W (C×d)."""
    return torch.softmax(weight @ weight.T, dim=1)


def dw_regularizer(weight: torch.Tensor, sl: torch.Tensor) -> torch.Tensor:
    """R = (1/C²)·‖S − rowsoftmax(W·Wᵀ)‖²_F (the code's ``MSELoss(S, softmax(W Wᵀ))``)."""
    return ((sl - class_relation(weight)) ** 2).mean()


@torch.no_grad()
def soft_label_sums(
    model: torch.nn.Module, data, num_classes: int, temperature: float = 1.0, batch_size: int = 512
):
    """One eval-mode pass: per true class, the sum of softmax(logits/T) (C×C) and the count (C)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    sums = torch.zeros(num_classes, num_classes, dtype=torch.float64, device=device)
    counts = torch.zeros(num_classes, dtype=torch.float64, device=device)
    for x, y in data.batches(batch_size, shuffle=False):
        probs = torch.softmax(model(x) / temperature, dim=1).double()
        sums.index_add_(0, y, probs)
        counts += torch.bincount(y, minlength=num_classes).double()
    model.train(was_training)
    return sums.cpu().numpy(), counts.cpu().numpy()


def update_soft_labels(
    prev: np.ndarray,
    sums: np.ndarray,
    counts: np.ndarray,
    momentum: float,
    missing_class: str = "onehot",
) -> np.ndarray:
    """S ← m·S_prev + (1 − m)·S_new with S_new[y] = sums[y] / counts[y]; see the module doc."""
    c = prev.shape[0]
    held = counts > 0
    fallback = np.eye(c) if missing_class == "onehot" else prev
    new = np.where(held[:, None], sums / np.maximum(counts, 1e-12)[:, None], fallback)
    return momentum * prev + (1.0 - momentum) * new


class FedDWDevice(GlobalModelDevice):
    """FedAvg's device plus the DW regulariser and the soft-label uplink.

    Written against ``super()`` so that it stacks on any global-model device (FedProx below).
    """

    dp_sgd_ready = False  # its soft-label sums are computed on the device's data outside training

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        if ctx.spec.head != "feddw":
            log.warning(
                "FedDW expects head='feddw' (bias-free classifier); %s has head %r",
                ctx.spec.name,
                ctx.spec.head,
            )
        self.sl = torch.eye(ctx.num_classes, device=self.device)

    def expected_downlink(self) -> dict[str, ArraySpec]:
        c = self.ctx.num_classes
        return {**super().expected_downlink(), SL: array_spec(np.float32, (c, c))}

    def receive(self, round: int, payload: Payload) -> None:
        super().receive(round, payload)
        if SL in payload.arrays:
            sl = np.asarray(payload.arrays[SL], np.float32)
            c = self.ctx.num_classes
            if sl.shape != (c, c):
                raise ValueError(f"soft-label matrix has shape {sl.shape}, expected {(c, c)}")
            self.sl = torch.from_numpy(sl.copy()).to(self.device)

    @classmethod
    def privacy_release(cls, options) -> Release:
        """FedAvg's weights, and per-class sums of each sample's soft label with the counts."""
        return Release(
            whole=(WEIGHTS,), stats=ClassStats((SL_SUMS,), reduce="sum", counts=SL_COUNTS)
        )

    def sample_vectors(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {SL_SUMS: torch.softmax(self.model(x) / self.options.temperature, dim=1)}

    def loss_fn(self, round: int):
        base = super().loss_fn(round) or (lambda x, y: F.cross_entropy(self.model(x), y))
        lam = self.options.lam_at(round)
        if lam == 0:
            return base
        weight, sl = self.model.classifier.weight, self.sl
        return lambda x, y: base(x, y) + lam * dw_regularizer(weight, sl)

    def fit(self, round: int) -> Payload:
        up = super().fit(round)
        sums, counts = soft_label_sums(
            self.model, self.ctx.train_data, self.ctx.num_classes, self.options.temperature
        )
        up.arrays[SL_SUMS] = sums.astype(np.float32)
        up.arrays[SL_COUNTS] = counts.astype(np.float32)
        up.meta["lam"] = self.options.lam_at(round)
        return up


class FedProxDWDevice(FedDWDevice, FedProxDevice):
    """FedProx + DW: MRO FedDW → FedProx → FedAvg, so the loss is CE + proximal + λ·R."""


class FedDWServer(GlobalModelServer):
    count_arrays = {SL_COUNTS: "samples"}  # one eval pass: clipped to the weight bound by the loop

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        c = ctx.num_classes
        self.sl = np.eye(c)
        self.sums = np.zeros((c, c))  # running totals (cumulative variant only)
        self.counts = np.zeros(c)

    def downlink(self, round: int, device_id: str) -> Payload:
        p = super().downlink(round, device_id)
        p.arrays[SL] = self.sl.astype(np.float32)
        return p

    def aggregate(self, round: int, uplinks: Mapping[str, Payload]) -> dict[str, float]:
        # the weights are averaged by the parent; only the ``w/`` arrays take part there
        metrics = super().aggregate(round, uplinks)
        c = self.ctx.num_classes
        sums, counts = np.zeros((c, c)), np.zeros(c)
        for p in uplinks.values():
            if SL_SUMS in p.arrays and SL_COUNTS in p.arrays:
                sums += np.asarray(p.arrays[SL_SUMS], np.float64).reshape(c, c)
                counts += np.asarray(p.arrays[SL_COUNTS], np.float64).reshape(c)
        if not uplinks:
            return metrics
        if self.options.cumulative:
            self.sums, self.counts = self.sums + sums, self.counts + counts
            sums, counts = self.sums, self.counts
        self.sl = update_soft_labels(
            self.sl, sums, counts, self.options.sl_momentum, self.options.missing_class
        )
        return {
            **metrics,
            "sl_diag_mean": float(np.mean(np.diag(self.sl))),
            "sl_classes_reported": float((counts > 0).sum()),
            **self.relation_metrics(),
        }

    def relation_metrics(self) -> dict[str, float]:
        """How close the global classifier's class relations come to the soft labels, the
        mechanism FedDW relies on (reported every round, with or without the regulariser):
        ``cr_diag_mean`` (mean of diag CR), ``cr_sl_diag_gap`` (mean |diag CR − diag S|) and
        ``cr_sl_distance`` (R itself, (1/C²)·‖S − CR‖²_F, against the S just computed). Empty for
        a model without a bias-free classifier (``head`` other than ``feddw``)."""
        w = self.weights.get(WEIGHTS + "classifier.weight")
        if w is None or WEIGHTS + "classifier.bias" in self.weights:
            return {}
        w, sl = torch.from_numpy(np.asarray(w, np.float64)), torch.from_numpy(self.sl)
        cr = class_relation(w).numpy()
        return {"cr_diag_mean": float(np.mean(np.diag(cr))),
                "cr_sl_diag_gap": float(np.mean(np.abs(np.diag(cr) - np.diag(self.sl)))),
                "cr_sl_distance": float(dw_regularizer(w, sl))}

    def expected_uplink(self, device_id: str) -> dict[str, ArraySpec]:
        c = self.ctx.num_classes
        return {
            **super().expected_uplink(device_id),
            SL_SUMS: array_spec(np.float32, (c, c)),
            SL_COUNTS: array_spec(np.float32, (c,)),
        }

    def state_dict(self) -> dict[str, np.ndarray]:
        return {
            **super().state_dict(),
            "sl/S": self.sl,
            "sl/sums": self.sums,
            "sl/counts": self.counts,
        }

    def load_state_dict(self, arrays: Mapping[str, np.ndarray]) -> None:
        super().load_state_dict(arrays)
        self.sl = np.array(arrays["sl/S"], np.float64)
        self.sums = np.array(arrays["sl/sums"], np.float64)
        self.counts = np.array(arrays["sl/counts"], np.float64)


#: The paper's setting: Adam 1e-3 re-created every round, batch 128, 5 local epochs; CNN tier 2
#: (Fashion-MNIST-sized) with the FedDW head. Use ``--steps`` for CPU-sized runs.
PAPER_DEFAULTS = {
    "model": "cnn",
    "tiers": ("2",),
    "head": "feddw",
    "optimizer": "adam",
    "lr": 1e-3,
    "batch_size": 128,
    "epochs": 5,
}

FEDDW = register(
    Algorithm(
        name="feddw",
        description="FedDW: FedAvg + soft-label (SL) vs classifier class-relation (CR) "
        "consistency regulariser",
        device=FedDWDevice,
        server=FedDWServer,
        options=FedDWOptions,
        defaults=PAPER_DEFAULTS,
        needs=MethodNeeds(averages_weights=True, asynchronous=True),
    )
)

#: FedDW over FedProx's device: FedDW's server, defaults and needs.
register(replace(
    FEDDW, name="fedprox-dw", device=FedProxDWDevice, options=FedProxDWOptions,
    description="FedProx + FedDW's SL/CR regulariser (the paper's compatibility combination)",
))
