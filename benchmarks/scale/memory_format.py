"""A local training step with the model's 4-D weights in PyTorch's default layout (NCHW) against
``channels_last`` (NHWC), side by side: a lever on the benchmarks' cost, measured, not adopted.

    python -m benchmarks.scale.memory_format [--repeats 5] [--steps 20]

Models: the ones the four costliest benchmarks train, at their recipes: CNN tier 2 at width 0.25,
SGD lr 0.05 with momentum, batch 32 (privacy's 1,000-device fleet, server_opt, foundation);
ResNet-10…26 at width 0.125 with the 7×7/2 stem, Adam lr 1e-3, batch 50 (felo_velo); the
hierarchy-depth tiers 1–4 at width 0.125 with the stride-2 stem, SGD lr 0.05 with momentum and
weight decay 5e-4, batch 32 (hierarchyfl). 28×28 one-channel inputs, one torch thread (a simulated
device's). One step is zero_grad, forward, cross-entropy, backward, optimizer step (the fused one
``make_optimizer`` builds). The two layouts start from the same weights and see the same batches;
they alternate (NCHW, NHWC, NHWC, NCHW, …) so load changes hit both, each repeat's time is this
process's CPU time (what a cell is charged, whatever else the machine runs), and the ratio is of
the medians. Before timing, one step from the same weights on the same batch is compared: the
layouts compute the same function in another summation order, so the weights differ by float
rounding (the largest difference is recorded), which training then amplifies: a run in the other
layout is another run, not the same one (``benchmarks.same_runs`` would say so). Writes
``memory_format.json`` and ``.md`` beside this file.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from benchmarks.common import measure_models, models_page
from benchmarks.scale.optimizer_step import step_timer
from benchmarks.timing import command_line

HERE = Path(__file__).resolve().parent
CNN = {"width": 0.25, "options": {}, "optimizer": "sgd", "lr": 0.05, "decay": 0.0, "batch": 32}
FELO = {"width": 0.125, "options": {"stem": "imagenet"}, "optimizer": "adam", "lr": 1e-3,
        "decay": 0.0, "batch": 50}
HIERARCHY = {"width": 0.125, "options": {"stem": "stride2"}, "optimizer": "sgd", "lr": 0.05,
             "decay": 5e-4, "batch": 32}
MODELS = {  # name → (family, tier, settings)
    "cnn tier 2 (privacy, server_opt, foundation)": ("cnn", "2", CNN),
    **{f"resnet-{t} (felo_velo)": ("resnet", t, FELO) for t in ("10", "14", "18", "22", "26")},
    **{f"hierarchy-depth {t} (hierarchyfl)": ("hierarchy-depth", t, HIERARCHY)
       for t in ("1", "2", "3", "4")},
}


def trainer(family: str, tier: str, settings: dict, channels_last: bool):
    from edgefl.algorithms.base import TrainSettings
    from edgefl.algorithms.training import make_optimizer
    from edgefl.models import ModelSpec, build_model

    torch.manual_seed(0)
    model = build_model(
        ModelSpec(
            family, tier, 10, (1, 28, 28), width=settings["width"], options=settings["options"]
        )
    )
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    ts = TrainSettings(optimizer=settings["optimizer"], lr=settings["lr"], momentum=0.9,
                       weight_decay=settings["decay"])
    opt = make_optimizer(model.parameters(), ts, 0)
    model.train()
    gen = torch.Generator().manual_seed(1)
    return model, step_timer(model, opt, settings["batch"], gen, clock=time.process_time)


def measure(name: str, family: str, tier: str, settings: dict, repeats: int, n: int) -> dict:
    nchw_model, nchw = trainer(family, tier, settings, channels_last=False)
    nhwc_model, nhwc = trainer(family, tier, settings, channels_last=True)
    # one step from the same weights on the same batch (each has its own generator, same seed)
    nchw(1), nhwc(1)
    diff = max(
        float((a - b).detach().abs().max())
        for a, b in zip(nchw_model.parameters(), nhwc_model.parameters(), strict=True)
    )
    nchw(3), nhwc(3)  # warm-up
    nchw_s, nhwc_s = [], []
    for i in range(repeats):  # alternating, the first of each pair swapped every repeat
        pair = ((nchw, nchw_s), (nhwc, nhwc_s))
        for run, out in pair if i % 2 == 0 else pair[::-1]:
            out.append(run(n) / n)
    a, b = statistics.median(nchw_s), statistics.median(nhwc_s)
    return {
        "model": name,
        "optimizer": settings["optimizer"],
        "batch": settings["batch"],
        "steps": n,
        "repeats": repeats,
        "nchw_ms": [round(s * 1e3, 2) for s in nchw_s],
        "channels_last_ms": [round(s * 1e3, 2) for s in nhwc_s],
        "nchw_ms_median": round(a * 1e3, 2),
        "channels_last_ms_median": round(b * 1e3, 2),
        "ratio": round(b / a, 3),
        "one_step_max_weight_difference": diff,
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=20, help="timed steps per repeat")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    info = {"torch_threads": 1, "torch": torch.__version__,
            "capability": torch.backends.cpu.get_cpu_capability(),
            "command": command_line("benchmarks.scale.memory_format", argv)}
    return measure_models(HERE / "memory_format", page, info, (
        measure(name, family, tier, settings, args.repeats, args.steps)
        for name, (family, tier, settings) in MODELS.items()))


#: The page's paragraph after how it was measured, and its table's columns.
ABOUT = (
    "One step: zero_grad, forward, cross-entropy, backward, fused optimizer step, on 28×28 "
    "one-channel inputs, at the benchmarks' recipes. NCHW is what every committed cell ran; "
    "channels_last converts the model's 4-D weights (`model.to(memory_format="
    "torch.channels_last)`; the one-channel input needs no conversion). CPU time of this process, "
    "alternating, medians of the repeats; a ratio under 1 is channels_last the faster. The last "
    "column is the largest difference between the two models' weights after one step from the "
    "same weights on the same batch: float rounding, which training amplifies, so adopting the "
    "layout would make every benchmark's runs other runs (not the same runs at a new code). "
    "Under Adam the first step moves each weight by about its lr whatever the gradient's size, so "
    "a gradient that rounding tips across zero moves its weight by up to twice the lr (2e-3 at lr "
    "1e-3). Each repeat's time is in `memory_format.json`: the ResNets' repeats spread widely on a "
    "2-core machine (a row's ratio is of medians; read them as ranges, not to two decimals)."
)
COLUMNS = ("model", "optimizer, batch", "NCHW (CPU ms/step)", "channels_last (CPU ms/step)",
           "channels_last ÷ NCHW", "weight difference after one step")


def page(results: dict) -> list[str]:
    return models_page(
        results, "A training step: NCHW weights against channels_last",
        f"one torch thread, torch {results['torch']} (CPU capability {results['capability']})",
        ABOUT, COLUMNS, row,
    )


def row(r: dict) -> tuple[str, ...]:
    return (
        r["model"], f"{r['optimizer']}, {r['batch']}", f"{r['nchw_ms_median']:.1f}",
        f"{r['channels_last_ms_median']:.1f}", f"**{r['ratio']:.2f}×**",
        f"{r['one_step_max_weight_difference']:.1e}",
    )


if __name__ == "__main__":
    main()
