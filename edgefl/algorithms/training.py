"""Local training and evaluation loops shared by the device halves."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from edgefl.algorithms.base import DeviceHalf, TrainSettings
from edgefl.data import ArrayDataset
from edgefl.errors import ConfigError
from edgefl.privacy.trainer import active_trainer

#: loss_fn(x, y) -> scalar loss; a closure over the model and whatever the method needs.
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@torch.no_grad()
def recalibrate_batch_norm(model: nn.Module, data: ArrayDataset, batch_size: int = 256) -> int:
    """Re-estimate the running statistics of every BatchNorm layer of ``model`` that keeps them,
    for its current weights, on ``data``: one pass in training mode without gradients, the
    statistics the plain mean over equal-sized batches (no momentum). The weights do not change.
    Returns the number of layers re-estimated (0: the model keeps no running statistics, or
    ``data`` has fewer than two samples, and nothing changed).

    Averaged weights do not produce the average of the devices' statistics; a device that
    receives averaged weights can re-estimate them on its own data (``bn_stats=recalibrate``)."""
    norms = [
        m
        for m in model.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
    ]
    if not norms or len(data) < 2:
        return 0
    batches = math.ceil(len(data) / batch_size)
    size = math.ceil(len(data) / batches)  # equal batches, so each weighs the same in the mean
    momenta = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a cumulative mean over the batches
    training = model.training
    model.train()
    try:
        device = next(model.parameters()).device
        for x, _ in data.batches(size, shuffle=False):
            if len(x) > 1:
                model(x.to(device))
    finally:
        model.train(training)
        for m, momentum in zip(norms, momenta, strict=True):
            m.momentum = momentum
    return len(norms)


def resolve_compute(name: str) -> str:
    """The torch device that trains, from ``--train-device``: "cpu", "cuda", "cuda:N", or "auto"
    (the first CUDA device when this torch build sees one, else the CPU). A CUDA device that
    this torch build cannot use is a configuration error, never a silent fall-back to the CPU."""
    name = name.strip().lower()
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"--train-device {name!r}: give cpu, cuda, cuda:N or auto") from None
    if device.type == "cpu":
        return "cpu"
    if device.type != "cuda":
        raise ConfigError(f"--train-device {name!r}: edgefl trains on cpu or cuda")
    if not torch.cuda.is_available():
        raise ConfigError(
            f"--train-device {name}: this torch build sees no CUDA device "
            f"(torch {torch.__version__}, torch.cuda.is_available() is False); "
            "use --train-device cpu, or install a CUDA build of torch (docs/install-pi-jetson.md)"
        )
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(
            f"--train-device {name}: only {torch.cuda.device_count()} CUDA device(s) here"
        )
    return str(device)


#: Devices for which PyTorch has fused optimizer kernels.
_FUSED_DEVICES = ("cpu", "cuda")


def make_optimizer(
    params: Iterable[nn.Parameter] | Iterable[dict], settings: TrainSettings, round: int
) -> torch.optim.Optimizer:
    """The optimizer of ``settings`` at ``round``'s learning rate.

    Where every parameter is floating point on a device PyTorch has a fused kernel for, the
    optimizer is fused: one kernel call updates all parameters, with the update rule of the
    per-parameter loop (PyTorch's default on CPU), which spent up to a fifth of a training step of
    the narrow models a CPU fleet trains (``benchmarks/scale/optimizer_step``)."""
    params = list(params)
    lr = settings.lr_at(round)
    tensors = [t for p in params for t in (p["params"] if isinstance(p, dict) else [p])]
    fused = bool(tensors) and all(
        t.is_floating_point() and t.device.type in _FUSED_DEVICES for t in tensors
    )
    decay, fuse = settings.weight_decay, fused or None
    if settings.optimizer == "sgd":
        return torch.optim.SGD(
            params, lr=lr, momentum=settings.momentum, weight_decay=decay, fused=fuse
        )
    if settings.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=decay, fused=fuse)
    raise ConfigError(f"unknown optimizer {settings.optimizer!r}; choose sgd or adam")


def local_batches(
    data: ArrayDataset, settings: TrainSettings, rng: np.random.Generator
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The minibatches of one round of local work: ``steps`` batches if set, else ``epochs`` passes.

    A shuffled pass whose last batch holds a single sample skips that sample (BatchNorm cannot
    train on a batch of one, and a shard of 801 images at batch 50 would otherwise crash a device
    every round); it is a different sample each pass.
    """
    if len(data) == 0:
        return

    def one_pass() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for x, y in data.batches(settings.batch_size, shuffle=True, rng=rng):
            if len(y) > 1 or len(data) == 1:
                yield x, y

    if settings.steps is None:
        for _ in range(settings.epochs):
            yield from one_pass()
        return
    done = 0
    while done < settings.steps:
        for batch in one_pass():
            yield batch
            done += 1
            if done == settings.steps:
                return


def optimizer_step(opt: torch.optim.Optimizer, settings: TrainSettings) -> None:
    """``opt.step()``, the gradient of all its parameters first scaled down to L2 norm
    ``settings.max_grad_norm`` when that is set (a step that a conflicting loss term would make
    large cannot throw the model off; off by default)."""
    if settings.max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(
            [p for group in opt.param_groups for p in group["params"] if p.grad is not None],
            settings.max_grad_norm,
        )
    opt.step()


def train_local(
    model: nn.Module,
    data: ArrayDataset,
    settings: TrainSettings,
    round: int,
    rng: np.random.Generator,
    loss_fn: LossFn | None = None,
    params: Iterable[nn.Parameter] | None = None,
) -> dict[str, float]:
    """Run one round of local training; returns the mean loss and the number of samples seen.

    Under DP-SGD (``dp=sgd``, :mod:`edgefl.privacy.dpsgd`) the device's trainer runs the round
    instead, with this optimizer: its own Poisson batches and steps, per-sample clipping, noise."""
    loss_fn = loss_fn or (lambda x, y: F.cross_entropy(model(x), y))
    model.train()
    opt = make_optimizer(params if params is not None else model.parameters(), settings, round)
    trainer = active_trainer()
    if trainer is not None:
        if settings.max_grad_norm is not None:
            raise ConfigError(
                "--max-grad-norm does not apply under dp=sgd: DP-SGD clips each sample's "
                "gradient to the privacy clip instead"
            )
        return trainer(model, data, settings, round, loss_fn, opt)
    total, seen = 0.0, 0
    for x, y in local_batches(data, settings, rng):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(x, y)
        loss.backward()
        optimizer_step(opt, settings)
        total += float(loss.detach()) * len(y)
        seen += len(y)
    # the gradients are of no use after the round; a fleet in memory would hold a set per device
    opt.zero_grad(set_to_none=True)
    return {"train_loss": total / max(seen, 1), "samples_seen": float(seen)}


def train_round(half: DeviceHalf, round: int, loss_fn: LossFn | None = None) -> dict[str, Any]:
    """One round of a device half's local training on its own data (:func:`train_local` with the
    round's generator); returns what its uplink's metadata starts with: ``num_samples`` and the
    training metrics."""
    ctx = half.ctx
    stats = train_local(half.model, ctx.train_data, ctx.settings, round, ctx.rng(round), loss_fn)
    return {"num_samples": len(ctx.train_data), **stats}


@torch.no_grad()
def evaluate(model: nn.Module, data: ArrayDataset, batch_size: int = 1000) -> dict[str, float]:
    """Accuracy (0–1) and mean cross-entropy of ``model`` on ``data``."""
    was_training = model.training
    model.eval()
    correct, loss, n = 0, 0.0, 0
    device = next(model.parameters()).device  # the data may live elsewhere (an eval set)
    for x, y in data.batches(batch_size, shuffle=False):
        x, y = x.to(device), y.to(device)
        logits = model(x)
        loss += float(F.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(1) == y).sum())
        n += len(y)
    model.train(was_training)
    return {"accuracy": correct / max(n, 1), "loss": loss / max(n, 1), "samples": float(n)}
