"""Why k = 2 devices collapsed: each device of the benchmark's k = 2 fleet trained alone.

A Local k = 2 run is ten devices training apart, so the collapse can be watched one device at a
time: each of the ten devices (seed 10's partition, 1,000 training images held out as in the
recipe sweep, so no test image is read) trains its tier's CNN alone for the epochs a benchmark
device gets (20: 40 rounds at half participation, ×0.1 after epochs 8 and 14), at each recipe of
the sweep (recipes.py). Per device: its two classes' image counts (is the shard unbalanced?), its
training loss after epochs 1, 5 and 20 (a loss that stays at ln 2 = 0.693 is a model that learned
the two-class prior: one class predicted), and the share of its own training images predicted as
its most predicted class (≥ 0.95: one class). Writes ``collapse.md``:
``python -m benchmarks.fedhenn.collapse``.

Tiers 3–5 train with dropout, which draws from torch's global generator: a device's run depends on
the devices trained before it in the same process, so each row is one draw (the same device can
collapse in one table and not in the other at lr 0.05, which is itself how unstable that recipe
is).

``--stuck``: the devices that predicted one class at a recipe of the sweep (here, in the sweep's
cells or in collapse.md), each trained alone the same way at the sweep's recipes and at Adam lr
1e-3 (the schedule and weight decay unchanged), a candidate for the next sweep; writes
``collapse_stuck.md``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

HERE = Path(__file__).resolve().parent
EPOCHS, DECAY = 20, (8, 14)
ADAM = {"optimizer": "adam", "lr": 0.001}
#: (partition seed, device): one class at lr 0.05 (collapse.md: d03, d06, d08; the sweep's seed-10
#: Local: d01, d08) or at lr 0.01 (the sweep's seed-14 Local: d09)
STUCK = ((10, "d01"), (10, "d03"), (10, "d06"), (10, "d08"), (14, "d09"))
HEADER = ["| recipe | seed | device | tier | images per class | loss ep. 1 | loss ep. 5 | "
          "loss ep. 20 | top-class share | one class? |", "|---" * 10 + "|"]


def fleet(seed: int):
    from benchmarks.fedhenn import HETERO, SETTINGS, profile
    from edgefl.algorithms import get_algorithm
    from edgefl.config import resolve_config
    from edgefl.runtime.setup import assemble

    cfg = {**profile(False), **SETTINGS["k2"], "algorithm": "local", "tiers": HETERO,
           "seed": seed, "validation_samples": 1000}
    return assemble(resolve_config(cfg, get_algorithm("local").defaults))


def row(run, seed: int, i: int, name: str, recipe: dict) -> str:
    """One device trained alone at ``recipe``: its table row."""
    import numpy as np
    import torch

    from edgefl.algorithms import TrainSettings
    from edgefl.algorithms.training import train_local
    from edgefl.models import build_model

    settings = TrainSettings(epochs=1, batch_size=32, weight_decay=1e-4, lr_decay_rounds=DECAY,
                             **{"momentum": 0.9, **recipe})
    shard, spec = run.data.shard(i), run.specs[run.ids[i]]
    with torch.random.fork_rng():
        torch.manual_seed(seed * 100 + i)
        model = build_model(spec)
    losses = [train_local(model, shard, settings, e, np.random.default_rng([i, e]))["train_loss"]
              for e in range(EPOCHS)]
    model.eval()
    with torch.no_grad():
        pred = torch.cat([model(x).argmax(1) for x, _ in shard.batches(1000, shuffle=False)])
    counts = shard.class_counts()
    share = np.bincount(pred.numpy(), minlength=len(counts)).max() / len(pred)
    held = ", ".join(f"{c}: {n}" for c, n in enumerate(counts) if n)
    line = (f"| {name} | {seed} | {run.ids[i]} | {spec.tier} | {held} | {losses[0]:.3f} | "
            f"{losses[4]:.3f} | {losses[-1]:.3f} | {share:.2f} | "
            f"{'yes' if share >= 0.95 else 'no'} |")
    print(line, flush=True)
    return line


def main(argv: list[str] | None = None) -> str:
    import torch

    from benchmarks.common import machine
    from benchmarks.fedhenn.recipes import CANDIDATES, SEEDS
    from benchmarks.provenance import code_version

    p = argparse.ArgumentParser(description="k = 2 devices trained alone (issue 37).")
    p.add_argument("--stuck", action="store_true", help="the devices that collapsed, + Adam")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    lines = ["# Why k = 2 devices collapsed: each device trained alone", ""]
    if args.stuck:
        recipes = {**CANDIDATES, "adam 1e-3": ADAM}
        runs = {seed: fleet(seed) for seed in dict.fromkeys(s for s, _ in STUCK)}
        what = (__doc__ or "").split("``--stuck``: ", 1)[1].split("; writes")[0]
        lines += [what[0].upper() + what[1:] + ".", ""]
        lines += HEADER + [row(runs[s], s, runs[s].ids.index(d), name, recipe)
                           for name, recipe in recipes.items() for s, d in STUCK]
        out = HERE / "collapse_stuck.md"
    else:
        run = fleet(SEEDS[0])
        lines += [(__doc__ or "").split("\n\n", 1)[1].split(" Writes")[0], ""]
        lines += HEADER + [row(run, SEEDS[0], i, name, recipe)
                           for name, recipe in CANDIDATES.items() for i in range(len(run.ids))]
        out = HERE / "collapse.md"
    m = machine()
    command = "nice -n 5 python -m benchmarks.fedhenn.collapse" + (" --stuck" if args.stuck else "")
    lines += ["", f"Run at `{code_version()}` with `{command}`; finished {m.get('date')}, load "
              f"(1/5/15 min) {m.get('loadavg_1_5_15')} on {m.get('cores')} cores."]
    text = "\n".join(lines) + "\n"
    out.write_text(text)
    return text


if __name__ == "__main__":
    main()
