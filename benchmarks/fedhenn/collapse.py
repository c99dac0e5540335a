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
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
EPOCHS, DECAY = 20, (8, 14)


def main() -> str:
    import numpy as np
    import torch

    from benchmarks.fedhenn import HETERO, SETTINGS, profile
    from benchmarks.fedhenn.recipes import CANDIDATES, SEEDS
    from edgefl.algorithms import TrainSettings, get_algorithm
    from edgefl.algorithms.training import train_local
    from edgefl.config import resolve_config
    from edgefl.models import build_model
    from edgefl.runtime.setup import assemble

    torch.set_num_threads(1)
    cfg = {**profile(False), **SETTINGS["k2"], "algorithm": "local", "tiers": HETERO,
           "seed": SEEDS[0], "validation_samples": 1000}
    run = assemble(resolve_config(cfg, get_algorithm("local").defaults))
    lines = [
        "# Why k = 2 devices collapsed: each device trained alone", "",
        (__doc__ or "").split("\n\n", 1)[1].split(" Writes")[0], "",
        "| recipe | device | tier | images per class | loss ep. 1 | loss ep. 5 | loss ep. 20 | "
        "top-class share | one class? |", "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, recipe in CANDIDATES.items():
        settings = TrainSettings(epochs=1, batch_size=32, weight_decay=1e-4,
                                 lr_decay_rounds=DECAY, **recipe)
        for i, device in enumerate(run.ids):
            shard, spec = run.data.shard(i), run.specs[device]
            with torch.random.fork_rng():
                torch.manual_seed(SEEDS[0] * 100 + i)
                model = build_model(spec)
            losses = [train_local(model, shard, settings, e, np.random.default_rng([i, e]))
                      ["train_loss"] for e in range(EPOCHS)]
            model.eval()
            with torch.no_grad():
                pred = torch.cat([model(x).argmax(1) for x, _ in shard.batches(
                    1000, shuffle=False)]).numpy()
            counts = shard.class_counts()
            share = np.bincount(pred, minlength=len(counts)).max() / len(pred)
            held = ", ".join(f"{c}: {n}" for c, n in enumerate(counts) if n)
            lines.append(
                f"| {name} | {device} | {spec.tier} | {held} | {losses[0]:.3f} | {losses[4]:.3f} "
                f"| {losses[-1]:.3f} | {share:.2f} | {'yes' if share >= 0.95 else 'no'} |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    (HERE / "collapse.md").write_text(text)
    return text


if __name__ == "__main__":
    main()
