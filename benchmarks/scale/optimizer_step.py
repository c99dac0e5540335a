"""A local training step with PyTorch's default CPU optimizer (a Python loop over the
parameters) against the fused kernel ``make_optimizer`` uses, side by side.

    python -m benchmarks.scale.optimizer_step [--repeats 5] [--steps 20]

Models: the demo's fleet (ResNet10/14/18/22/26 at width 0.125 with the 7×7/2 stem, Adam at lr 3e-3,
batch 50) and the two models of ``training_loop`` (CNN tier 2 and ResNet-18 at width 0.25, SGD with
momentum, batch 32), on 28×28 one-channel inputs, one torch thread (a simulated device's). One step
is zero_grad, forward, cross-entropy, backward, optimizer step. Both optimizers start from the same
weights and see the same batches; they alternate (loop, fused, loop, …) so load changes hit both,
and the ratio is of the medians. Before timing, one step from the same weights on the same batch
is compared: the fused kernel implements the same update rule, so the weights agree to float
rounding (the largest difference is recorded). Writes ``optimizer_step.json`` and ``.md`` beside
this file.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.common import measure_models, models_page
from benchmarks.timing import command_line

HERE = Path(__file__).resolve().parent
DEMO = {
    "width": 0.125,
    "options": {"stem": "imagenet"},
    "optimizer": "adam",
    "lr": 3e-3,
    "batch": 50,
}
TRAINING_LOOP = {"options": {}, "optimizer": "sgd", "lr": 0.01, "batch": 32}
MODELS = {  # name → (family, tier, settings)
    **{
        f"resnet-{t} (width 0.125, demo)": ("resnet", t, DEMO)
        for t in ("10", "14", "18", "22", "26")
    },
    "cnn tier 2 (width 1)": ("cnn", "2", {**TRAINING_LOOP, "width": 1.0}),
    "resnet-18 (width 0.25)": ("resnet", "18", {**TRAINING_LOOP, "width": 0.25}),
}


def trainer(family: str, tier: str, settings: dict, fused: bool):
    from edgefl.algorithms.base import TrainSettings
    from edgefl.algorithms.training import make_optimizer
    from edgefl.models import ModelSpec, build_model

    torch.manual_seed(0)
    model = build_model(
        ModelSpec(
            family, tier, 10, (1, 28, 28), width=settings["width"], options=settings["options"]
        )
    )
    if fused:
        ts = TrainSettings(optimizer=settings["optimizer"], lr=settings["lr"], momentum=0.9)
        opt = make_optimizer(model.parameters(), ts, 0)
        assert opt.defaults.get("fused"), "make_optimizer did not fuse on CPU"
    elif settings["optimizer"] == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=settings["lr"], foreach=False)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=settings["lr"], momentum=0.9, foreach=False)
    gen = torch.Generator().manual_seed(1)

    def update_only(n: int) -> float:
        """``n`` optimizer steps alone, on the gradients of the last step."""
        t0 = time.perf_counter()
        for _ in range(n):
            opt.step()
        return time.perf_counter() - t0

    return model, step_timer(model, opt, settings["batch"], gen), update_only


def step_timer(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: int,
               gen: torch.Generator, clock: Callable[[], float] = time.perf_counter,
               ) -> Callable[[int], float]:
    """``steps(n)``: ``n`` training steps (zero_grad, forward, cross-entropy, backward, optimizer
    step) on random 28×28 one-channel batches of ``batch`` drawn from ``gen`` before the clock
    starts; returns the ``clock`` seconds they took."""
    def steps(n: int) -> float:
        batches = [
            (
                torch.rand(batch, 1, 28, 28, generator=gen),
                torch.randint(0, 10, (batch,), generator=gen),
            )
            for _ in range(n)
        ]
        t0 = clock()
        for x, y in batches:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
        return clock() - t0

    return steps


def measure(name: str, family: str, tier: str, settings: dict, repeats: int, n: int) -> dict:
    loop_model, loop, loop_update = trainer(family, tier, settings, fused=False)
    fused_model, fused, fused_update = trainer(family, tier, settings, fused=True)
    # one step from the same weights on the same batch (each has its own generator, same seed)
    loop(1), fused(1)
    diff = max(
        float((a - b).detach().abs().max())
        for a, b in zip(loop_model.parameters(), fused_model.parameters(), strict=True)
    )
    loop(3), fused(3)  # warm-up
    loop_s, fused_s = [], []
    for _ in range(repeats):
        loop_s.append(loop(n) / n)
        fused_s.append(fused(n) / n)
    loop_u, fused_u = [], []
    for _ in range(repeats):
        loop_u.append(loop_update(n) / n)
        fused_u.append(fused_update(n) / n)
    lm, fm = statistics.median(loop_s), statistics.median(fused_s)
    lu, fu = statistics.median(loop_u), statistics.median(fused_u)
    return {
        "model": name,
        "optimizer": settings["optimizer"],
        "batch": settings["batch"],
        "steps": n,
        "repeats": repeats,
        "parameters": sum(1 for _ in loop_model.parameters()),
        "loop_ms": [round(s * 1e3, 2) for s in loop_s],
        "fused_ms": [round(s * 1e3, 2) for s in fused_s],
        "loop_ms_median": round(lm * 1e3, 2),
        "fused_ms_median": round(fm * 1e3, 2),
        "speedup": round(lm / fm, 3),
        "loop_update_ms_median": round(lu * 1e3, 3),
        "fused_update_ms_median": round(fu * 1e3, 3),
        "one_step_max_weight_difference": diff,
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=20, help="timed steps per repeat")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    info = {"torch_threads": 1, "torch": torch.__version__,
            "command": command_line("benchmarks.scale.optimizer_step", argv)}
    return measure_models(HERE / "optimizer_step", page, info, (
        measure(name, family, tier, settings, args.repeats, args.steps)
        for name, (family, tier, settings) in MODELS.items()))


#: The page's paragraph after how it was measured, and its table's columns.
ABOUT = (
    "One step: zero_grad, forward, cross-entropy, backward, optimizer step, on 28×28 one-channel "
    "inputs. The loop is PyTorch's default on CPU (`foreach=False`); fused is what "
    "`make_optimizer` builds. Alternating, medians of the repeats. The update alone is the "
    "optimizer's step timed by itself on the last gradients, without the model's compute, so it "
    "is less noisy than the whole step. The last column is the largest difference between the two "
    "models' weights after one step from the same weights on the same batch (float rounding: the "
    "update rule is the same; over many steps training amplifies it, as it does any change of "
    "summation order)."
)
COLUMNS = ("model", "optimizer, batch", "parameter tensors", "loop (ms/step)", "fused (ms/step)",
           "loop ÷ fused", "update alone, loop → fused (ms)", "weight difference after one step")


def page(results: dict) -> list[str]:
    return models_page(
        results, "A training step: the per-parameter optimizer loop against the fused kernel",
        f"one torch thread, torch {results['torch']}", ABOUT, COLUMNS, row,
    )


def row(r: dict) -> tuple[str, ...]:
    return (
        r["model"], f"{r['optimizer']}, {r['batch']}", str(r["parameters"]),
        f"{r['loop_ms_median']:.1f}", f"{r['fused_ms_median']:.1f}", f"**{r['speedup']:.2f}×**",
        f"{r['loop_update_ms_median']:.2f} → {r['fused_update_ms_median']:.2f}",
        f"{r['one_step_max_weight_difference']:.1e}",
    )


if __name__ == "__main__":
    main()
