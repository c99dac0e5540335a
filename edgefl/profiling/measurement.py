"""How fast this device trains (the compute benchmark, :func:`profile_device`) and what a model
costs (FLOPs, parameters and saved activations by one traced forward pass; the memory and
round-time estimates built on them, documented in :mod:`edgefl.profiling`)."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edgefl.errors import ConfigError
from edgefl.profiling.detection import (
    _accelerator,
    _torch,
    cpu_model,
    detect_kind,
    jetson_release,
    memory_mb,
)
from edgefl.profiling.profile import DeviceProfile

if TYPE_CHECKING:
    from torch import nn

    from edgefl.models import ModelSpec

OPTIMIZER_STATES = {"sgd": 0, "sgd-momentum": 1, "adam": 2}
BYTES = 4  # float32


def _reference_cnn() -> nn.Module:
    """The fixed small CNN whose training throughput calibrates round-time estimates."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(64, 10),
    )  # fmt: skip


REFERENCE_INPUT = (3, 32, 32)
REFERENCE_BATCH = 32


def _step_seconds(fn, seconds: float, min_reps: int = 5) -> float:
    """A fast-quantile time of one call of ``fn``, over about ``seconds`` of calls.

    The first calls in a process pay for allocations and kernel selection, and a shared machine
    stalls some calls; the 25th percentile of the per-call times measures what the device can
    do rather than how busy it happened to be.
    """
    for _ in range(3):  # warm-up
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_reps or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= 10_000:
            break
    times.sort()
    return max(times[len(times) // 4], 1e-9)


def benchmark_matmul(seconds: float = 0.5, n: int = 512) -> float:
    """float32 GFLOP/s of n×n matmuls on the CPU (torch's; numpy's BLAS without torch)."""
    torch = _torch()
    if torch is None:
        import numpy as np

        rng = np.random.default_rng(0)
        a, b = rng.standard_normal((n, n), np.float32), rng.standard_normal((n, n), np.float32)
        return 2 * n**3 / _step_seconds(lambda: a @ b, seconds) / 1e9
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / _step_seconds(lambda: torch.mm(a, b), seconds) / 1e9


def benchmark_training(seconds: float = 1.0) -> tuple[float, float]:
    """(images/s, effective training GFLOP/s) of the reference CNN, forward+backward+SGD step."""
    import torch
    from torch import nn

    gen = torch.Generator().manual_seed(0)
    model = _reference_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.rand(REFERENCE_BATCH, *REFERENCE_INPUT, generator=gen)
    y = torch.randint(0, 10, (REFERENCE_BATCH,), generator=gen)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    images_per_s = REFERENCE_BATCH / _step_seconds(step, seconds)
    macs = trace_module(model, REFERENCE_INPUT).macs
    return images_per_s, images_per_s * 6 * macs / 1e9


def profile_device(
    quick: bool = False, *, name: str | None = None, root: Path | str = "/"
) -> DeviceProfile:
    """Detect this device and measure it: about 1.5 s of benchmarks (0.4 s with ``quick``)."""
    kind, board = detect_kind(root)
    accelerator, acc_mem = _accelerator(kind, board)
    total, available = memory_mb(root)
    scale = 0.25 if quick else 1.0
    torch = _torch()
    images_per_s, train_gflops = (
        benchmark_training(1.0 * scale) if torch is not None else (0.0, 0.0)
    )
    return DeviceProfile(
        name=name or platform.node() or "device",
        arch=platform.machine(),
        cpu_model=cpu_model(root),
        cores=os.cpu_count() or 1,
        ram_total_mb=total,
        ram_available_mb=available,
        kind=kind,
        board=board,
        accelerator=accelerator,
        accelerator_memory_mb=acc_mem,
        jetson_release=jetson_release(root),
        os=f"{platform.system()} {platform.release()}",
        python=platform.python_version(),
        torch=torch.__version__ if torch is not None else "",
        threads=torch.get_num_threads() if torch is not None else 1,
        matmul_gflops=round(benchmark_matmul(0.5 * scale), 2),
        train_images_per_s=round(images_per_s, 1),
        train_gflops=round(train_gflops, 3),
        source="measured"
        + (" (quick)" if quick else "")
        + ("" if torch is not None else " (no torch: matmul only)"),
    )


@dataclass(frozen=True)
class ModelCost:
    """Per-sample costs of one model, from one traced forward pass."""

    parameters: int
    macs: int  # multiply-accumulates of one forward pass of one sample
    activation_bytes: int  # tensors autograd saves for backward, per sample
    largest_activation_bytes: int  # the largest single module output, per sample
    input_bytes: int
    num_classes: int


def trace_module(model: nn.Module, in_shape: tuple[int, ...], batch: int = 2) -> ModelCost:
    """Count MACs and measure saved activations of ``model`` on a batch of random inputs.

    ``batch`` is 2, not 1, because BatchNorm refuses a single value per channel in train mode;
    the results are divided back to one sample.
    """
    import torch
    from torch import nn

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    macs = 0
    largest = 0

    def hook(module, inputs, output):
        nonlocal macs, largest
        if isinstance(output, torch.Tensor):
            largest = max(largest, output.numel())
            if isinstance(module, nn.Conv2d):
                kh, kw = module.kernel_size
                macs += output.numel() * (module.in_channels // module.groups) * kh * kw
            elif isinstance(module, nn.Linear):
                macs += output.numel() * module.in_features

    saved: dict[tuple[int, int], int] = {}

    def pack(t: torch.Tensor):
        # One storage saved by several ops (a ReLU output feeding a conv) counts once;
        # parameters are counted with the weights, not as activations.
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[(storage.data_ptr(), storage.nbytes())] = storage.nbytes()
        return t

    handles = [m.register_forward_hook(hook) for m in model.modules() if not list(m.children())]
    was_training = model.training
    model.train()
    try:
        x = torch.rand(batch, *in_shape, requires_grad=False)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(x)
        del out
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return ModelCost(
        parameters=sum(p.numel() for p in model.parameters()),
        macs=macs // batch,
        activation_bytes=sum(saved.values()) // batch,
        largest_activation_bytes=largest * BYTES // batch,
        input_bytes=math.prod(in_shape) * BYTES,
        num_classes=0,
    )


@functools.lru_cache(maxsize=256)
def model_cost(spec: ModelSpec) -> ModelCost:
    """The :class:`ModelCost` of the model ``spec`` describes (cached per spec)."""
    import torch

    from edgefl.models import build_model

    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(0)
        cost = trace_module(build_model(spec), spec.in_shape)
    finally:
        torch.random.set_rng_state(state)  # estimating must not change the caller's random stream
    return dataclasses.replace(cost, num_classes=spec.num_classes)


def training_flops_per_sample(spec: ModelSpec) -> float:
    return 6.0 * model_cost(spec).macs


def estimate_training_memory_mb(
    spec: ModelSpec, batch_size: int, optimizer: str = "sgd-momentum"
) -> float:
    """Estimated peak training memory in MiB (formula in the module docstring)."""
    if optimizer not in OPTIMIZER_STATES:
        raise ConfigError(
            f"unknown optimizer {optimizer!r}; choose one of: {', '.join(OPTIMIZER_STATES)}"
        )
    c = model_cost(spec)
    weights = c.parameters * BYTES * (2 + OPTIMIZER_STATES[optimizer])
    per_sample = (
        c.activation_bytes + c.input_bytes + BYTES * c.num_classes + c.largest_activation_bytes
    )
    return (weights + batch_size * per_sample) / 2**20


def estimate_round_seconds(
    spec: ModelSpec, profile: DeviceProfile, samples_per_round: int
) -> float:
    """Estimated seconds of local training on ``samples_per_round`` samples on ``profile``."""
    if profile.train_gflops <= 0:
        raise ConfigError(f"device profile {profile.name!r} has no measured train_gflops")
    return samples_per_round * training_flops_per_sample(spec) / (profile.train_gflops * 1e9)
