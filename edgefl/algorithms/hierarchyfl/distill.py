"""HierarchyFL's server step (:mod:`edgefl.algorithms.hierarchyfl`): HeteroFL's averaging, then
the ensemble library and hierarchical self-distillation of the global model on the server's
labelled public set. The derivation: docs/methods/hierarchyfl.md."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from edgefl.algorithms.base import ServerContext
from edgefl.algorithms.hierarchyfl.submodels import (
    HeteroFLOptions,
    HeteroFLServer,
    leading,
    state_shapes,
    template,
)
from edgefl.errors import ConfigError
from edgefl.models import family_tiers
from edgefl.models.hierarchy import MultiExitResNet
from edgefl.wire import Payload

log = logging.getLogger(__name__)

THETA = "meta/theta"


@dataclass(frozen=True)
class HierarchyFLOptions(HeteroFLOptions):
    # ablation: averaging / +logits / +features; labels: the public labels' CE only (a control)
    ensemble: Literal["none", "labels", "logits", "full"] = "full"
    temperature: float = 1.0  # chosen by the benchmark's sweep over {1, 3} (validation split)
    beta: float = 1.0  # weight of the feature MSE terms
    server_ce: bool = True  # CE on the public labels for every exit, besides the distillation terms
    distill_steps: int | None = None  # None: one pass over the public set
    meta_lr: float = 0.05
    meta_optimizer: Literal["sgd", "adam"] = "sgd"
    # before decay (it follows the run's lr_decay_rounds); None: the devices' lr (swept 0.005, 0.05)
    server_lr: float | None = 0.05
    server_momentum: float = 0.0
    server_weight_decay: float = 5e-4
    # share of the public set held out to measure each exit before and after the step
    check_share: float = 0.0

    def __post_init__(self):
        if self.temperature <= 0:
            raise ValueError("temperature must be > 0")
        if self.beta < 0:
            raise ValueError("beta must be >= 0")
        if self.distill_steps is not None and self.distill_steps < 0:
            raise ValueError("distill_steps must be >= 0")
        if self.meta_lr <= 0 or (self.server_lr is not None and self.server_lr <= 0):
            raise ValueError("meta_lr and server_lr must be > 0")
        if not 0 <= self.check_share < 1:
            raise ValueError("check_share must be in [0, 1)")
        if self.ensemble == "labels" and not self.server_ce:
            raise ValueError(
                "ensemble=labels trains on the public labels' CE alone: it needs server_ce"
            )


def server_lr_at(options: HierarchyFLOptions, settings, round: int) -> float:
    """The server step's lr at ``round``: ``server_lr`` on the run's decay schedule (the paper's
    "same lr schedule"), or the devices' lr itself when ``server_lr`` is None."""
    if options.server_lr is None:
        return settings.lr_at(round)
    return options.server_lr * settings.lr_scale(round)


class _FeaturesAndLogits(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        s = self.model.features(x)
        return s, self.model.classify(s)


def kd_loss(student: Tensor, teacher: Tensor, temperature: float) -> Tensor:
    """KL(softmax(teacher/T) ‖ softmax(student/T))·T², teacher detached, mean over the batch."""
    t = temperature
    return (
        F.kl_div(
            F.log_softmax(student / t, 1), F.softmax(teacher.detach() / t, 1), reduction="batchmean"
        )
        * t
        * t
    )


def feature_mse(student: Tensor, teacher: Tensor) -> Tensor:
    """Mean squared error over the student's channels, aligned by leading slice to the teacher's."""
    return F.mse_loss(student, teacher.detach()[:, : student.shape[1]])


def slice_aligned_mixture(features: list[Tensor], weights: Tensor) -> Tensor:
    """Σ M_i·F_i per channel over the tiers that have the channel (weights renormalised there)."""
    dim = max(f.shape[1] for f in features)
    num = features[0].new_zeros(features[0].shape[0], dim)
    den = features[0].new_zeros(dim)
    for f, m in zip(features, weights, strict=True):
        num[:, : f.shape[1]] += m * f
        den[: f.shape[1]] += m
    return num / den


class HierarchyFLServer(HeteroFLServer):
    """HeteroFL's averaging, then the ensemble library and hierarchical self-distillation."""

    def __init__(self, ctx: ServerContext, options: HierarchyFLOptions):
        super().__init__(ctx, options)
        self.tiers = family_tiers(self.spec.family)  # smallest → the global tier, last
        self.theta = torch.zeros(len(self.tiers))
        if options.ensemble != "none" and (ctx.public is None or len(ctx.public) == 0):
            raise ConfigError(
                "HierarchyFL distils on a server-held public set, but there is none "
                "(public_fraction > 0)"
            )
        self.distill_set, self.check_set = ctx.public, None
        if options.ensemble != "none" and options.check_share > 0:
            from edgefl.data import carve_public

            labels = ctx.public.y.numpy()
            check_idx, rest = carve_public(labels, options.check_share, seed=ctx.seed + 11)
            self.distill_set, self.check_set = ctx.public.subset(rest), ctx.public.subset(check_idx)
        self._views = None
        if not isinstance(self.model, MultiExitResNet):
            # width tiers: each tier's architecture, run functionally on slices of the global ones
            self._views = [
                _FeaturesAndLogits(template(replace(self.spec, tier=t))) for t in self.tiers
            ]

    def meta_weights(self) -> np.ndarray:
        return torch.softmax(self.theta, 0).numpy()

    def hierarchy_outputs(self, x: Tensor) -> list[tuple[Tensor, Tensor]]:
        """(features, logits) of every tier, smallest first, as functions of the global weights."""
        if self._views is None:
            return self.model.forward_exits(x)
        tensors = {**dict(self.model.named_parameters()), **dict(self.model.named_buffers())}
        out = []
        for view in self._views:
            # leading-slice *views* of the global tensors: L_G's gradients land in the global model
            sliced = {
                f"model.{k}": tensors[k][leading(s)]
                for k, s in state_shapes(view.model.spec).items()
            }
            view.train(self.model.training)
            out.append(functional_call(view, sliced, (x,)))
        return out

    def distillation_loss(
        self, outputs: list[tuple[Tensor, Tensor]], weights: Tensor, y: Tensor | None = None
    ) -> Tensor:
        """L_G of the spec, with β = 0 for ``ensemble=logits``; plus Σ_i CE(P_i, y) on the public
        labels when ``server_ce`` (the errata's default) and labels are given; ``ensemble=labels``:
        that CE alone."""
        o = self.options
        if o.ensemble == "labels":
            if y is None:
                raise ValueError("ensemble=labels needs the public labels")
            return sum(F.cross_entropy(p, y) for _, p in outputs)
        beta = o.beta if o.ensemble == "full" else 0.0
        feats = [f for f, _ in outputs]
        logits = [p for _, p in outputs]
        fn, pn = feats[-1], logits[-1]
        loss = kd_loss(
            pn, sum(m * p.detach() for m, p in zip(weights, logits, strict=True)), o.temperature
        )
        if beta:
            loss = loss + beta * feature_mse(
                fn, slice_aligned_mixture([f.detach() for f in feats], weights)
            )
        for f, p in zip(feats[:-1], logits[:-1], strict=True):
            loss = loss + kd_loss(p, pn, o.temperature)
            if beta:
                loss = loss + beta * feature_mse(f, fn)
        if o.server_ce and y is not None:
            loss = loss + sum(F.cross_entropy(p, y) for p in logits)
        return loss

    @torch.no_grad()
    def exit_accuracies(self, data) -> np.ndarray:
        """Each tier's accuracy (smallest first) on ``data``, the global model in eval mode."""
        training = self.model.training
        self.model.eval()
        correct = np.zeros(len(self.tiers))
        for x, y in data.batches(256, shuffle=False):
            for i, (_, p) in enumerate(self.hierarchy_outputs(x)):
                correct[i] += float((p.argmax(1) == y).sum())
        self.model.train(training)
        return correct / max(len(data), 1)

    def distill(self, round: int) -> dict[str, float]:
        o, public = self.options, self.distill_set
        steps = (
            math.ceil(len(public) / self.ctx.settings.batch_size)
            if o.distill_steps is None
            else o.distill_steps
        )
        before = self.exit_accuracies(self.check_set) if self.check_set is not None else None
        lr = server_lr_at(o, self.ctx.settings, round)
        opt = torch.optim.SGD(
            self.model.parameters(),
            lr=lr,
            momentum=o.server_momentum,
            weight_decay=o.server_weight_decay,
        )
        theta = self.theta.clone().requires_grad_(True)
        meta_cls = torch.optim.Adam if o.meta_optimizer == "adam" else torch.optim.SGD
        meta_opt = meta_cls([theta], lr=o.meta_lr)
        rng = self.ctx.rng(round, 1)
        self.model.train()
        losses, meta_losses, meta_grads, done = [], [], [], 0
        while done < steps:
            for x, y in public.batches(self.ctx.settings.batch_size, shuffle=True, rng=rng):
                outputs = self.hierarchy_outputs(x)
                # meta-learner step on θ only (the tiers' logits are constants here)
                mix = sum(
                    m * p.detach()
                    for m, (_, p) in zip(torch.softmax(theta, 0), outputs, strict=True)
                )
                meta_loss = F.cross_entropy(mix, y)
                meta_opt.zero_grad(set_to_none=True)
                meta_loss.backward()
                meta_grads.append(float(theta.grad.abs().max()))
                meta_opt.step()
                # self-distillation step on the global model, with the updated M (a constant)
                loss = self.distillation_loss(outputs, torch.softmax(theta.detach(), 0), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                losses.append(float(loss.detach()))
                meta_losses.append(float(meta_loss.detach()))
                done += 1
                if done == steps:
                    break
        self.theta = theta.detach().clone()
        self._downlinks.clear()
        metrics = {
            "distill_loss": float(np.mean(losses)) if losses else 0.0,
            "distill_steps": float(done),
            "meta_loss": float(np.mean(meta_losses)) if meta_losses else 0.0,
            "meta_grad": float(np.mean(meta_grads)) if meta_grads else 0.0,  # mean max |∂L_M/∂θ|
        }
        metrics.update(
            {
                f"meta_weight_{t}": float(w)
                for t, w in zip(self.tiers, self.meta_weights(), strict=True)
            }
        )
        if before is not None:
            after = self.exit_accuracies(self.check_set)
            for t, b, a in zip(self.tiers, before, after, strict=True):
                metrics[f"check_before_{t}"], metrics[f"check_after_{t}"] = float(b), float(a)
            change = float(np.mean(after - before))
            metrics["check_change"] = change
            if change < -1e-9:  # not float noise of equal accuracies
                log.warning(
                    "round %d: the server step lowered the exits' mean accuracy on the check "
                    "split by %.1f points",
                    round + 1,
                    -100 * change,
                )
        return metrics

    def aggregate(self, round: int, uplinks: Mapping[str, Payload]) -> dict[str, float]:
        metrics = self.average(uplinks)
        if self.options.ensemble != "none":
            metrics.update(self.distill(round))
        return metrics

    def state_dict(self) -> dict[str, np.ndarray]:
        return {**super().state_dict(), THETA: self.theta.numpy().astype(np.float32)}

    def load_state_dict(self, arrays: Mapping[str, np.ndarray]) -> None:
        super().load_state_dict(arrays)
        if THETA in arrays:
            self.theta = torch.from_numpy(np.array(arrays[THETA], np.float32))
