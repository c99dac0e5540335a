"""How HierarchyFL's (and HeteroFL's) defaults for short runs were chosen: on a validation split,
never the test set.

Issue 15 asks that ``edgefl simulate --algorithm hierarchyfl --clients 4 --rounds 2 --train-samples
4000`` alone reaches 60 % mean device accuracy within 2 minutes on 2 cores. Measured on it: the
global sub-models lose most of their accuracy to BatchNorm running statistics averaged over devices
whose weights moved apart (HeteroFL's tiers at 14-25 % with them, 40-63 % with each test batch's
own), and each device takes 31 SGD steps per round (990 images, one epoch, batch 32). Open are the
devices' BatchNorm statistics (``bn_stats``: the uploads' average, or recalibrated by each device on
its own data) and the local epochs per round (1, the errata's; 2; 3; the paper's 5 is left out: it
would spend five times the local time of every default run, the no-option one included). The lr
stays the paper's 0.05.

Part A runs the quick command itself with 1,000 more training images held out as the validation
split (5,000 drawn, so the devices keep their 990 images each), seeds 0 and 1, every candidate of
``bn_stats`` × epochs; the choice is the best mean validation accuracy. Part B checks ``bn_stats``
where the quick command cannot, on non-IID data over a longer run: the benchmark's own Dir(0.1)
validation profile (its β sweep's cells at the default β = 1: 8 devices, 20 rounds, server step at
lr 0.005 and T = 3), whose ``average`` cells are the benchmark's cached ones. Seconds are wall
times of single-threaded runs on a shared 2-core machine under a varying load (the benchmark's
cells ran on another day): they say how the epochs scale, not what recalibration costs (one
forward pass over a device's images per received model, about a sixth of a local epoch).

    python -m benchmarks.hierarchyfl.quick_defaults
"""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

from benchmarks.runner import Cache, Cell, run_cells

HERE = Path(__file__).resolve().parent / "quick_defaults"
BENCHMARK_CELLS = Path(__file__).resolve().parent / "cells"
EXTRAS = "benchmarks.hierarchyfl.extras:extras"

#: the quick command (everything else at the method's defaults), with a validation split carved out
#: of 1,000 more training images, so that the devices train on as many images as in the command
QUICK = {
    "algorithm": "hierarchyfl",
    "clients": 4,
    "rounds": 2,
    "train_samples": 5000,
    "validation_samples": 1000,
}
BN_STATS = ("average", "recalibrate")
EPOCHS = (1, 2, 3)
SEEDS = (0, 1)


def quick_cells() -> dict[tuple[str, int], list[Cell]]:
    """(bn_stats, epochs) → its cells, one per seed."""
    return {(bn, epochs): [Cell(f"hierarchyfl-{bn}-{epochs}ep", "quick-iid-validation", seed,
                                {**QUICK, "epochs": epochs, "options": {"bn_stats": bn}}, "sweep")
                           for seed in SEEDS]
            for bn in BN_STATS for epochs in EPOCHS}


def dirichlet_cells() -> dict[str, list[Cell]]:
    """bn_stats → the benchmark's Dir(0.1) validation cells at β = 1, with that ``bn_stats``."""
    import benchmarks.hierarchyfl as bench

    beta = next(s for s in bench.make(False).sweeps if s.parameter == "hierarchyfl.beta")
    cells = beta.cells[1.0]
    out = {}
    for bn in BN_STATS:
        out[bn] = [
            replace(
                c,
                method=f"hierarchyfl-{bn}",
                config={**c.config, "options": {**c.config["options"], "bn_stats": bn}},
            )
            for c in cells
        ]
    return out


def run(cells: list[Cell]) -> list[dict]:
    """Every cell's record: from the benchmark's cache where it holds the cell, else from (or run
    into) this sweep's own cache, one cell at a time."""
    shared, own = Cache(BENCHMARK_CELLS, EXTRAS), Cache(HERE / "cells", EXTRAS)
    records = {c: shared.get(c) for c in cells}
    todo = [c for c in cells if records[c] is None]
    for c, r in zip(todo, run_cells(todo, own, workers=1, keep_server_metrics=()), strict=True):
        records[c] = r
    return [records[c] for c in cells]


def pct(x: float) -> str:
    return f"{100 * x:.2f} %"


def main() -> None:
    quick, dirichlet = quick_cells(), dirichlet_cells()
    flat = [c for cs in quick.values() for c in cs] + [c for cs in dirichlet.values() for c in cs]
    records = dict(zip(flat, run(flat), strict=True))

    rows, means = [], {}
    for (bn, epochs), cells in quick.items():
        rs = [records[c] for c in cells]
        accs = [r["final_accuracy"] for r in rs]
        means[(bn, epochs)] = statistics.fmean(accs)
        tiers = {t: statistics.fmean(r["per_tier"][t] for r in rs) for t in rs[0]["per_tier"]}
        rows.append(
            {
                "bn_stats": bn,
                "epochs": epochs,
                "validation_accuracy": accs,
                "mean": means[(bn, epochs)],
                "per_tier_mean": tiers,
                "seconds": [r["wall_seconds"] for r in rs],
                "keys": [r["key"] for r in rs],
            }
        )
    best_bn, best_epochs = max(means, key=means.get)
    check = {}
    for bn, cells in dirichlet.items():
        rs = [records[c] for c in cells]
        check[bn] = {"validation_accuracy": [r["final_accuracy"] for r in rs],
                     "mean": statistics.fmean(r["final_accuracy"] for r in rs),
                     "seconds": [r["wall_seconds"] for r in rs], "keys": [r["key"] for r in rs]}

    doc = __doc__.split("\n\n")
    lines = [
        "# HierarchyFL's defaults for short runs (validation split)",
        "",
        *(p.replace("\n", " ") + "\n" for p in doc[1:4]),
        "## Part A: the quick command, IID, 4 devices (one per tier), 2 rounds",
        "",
        "| bn_stats | epochs | validation accuracy per seed | mean | per tier (mean over seeds) | "
        "seconds per run (1 thread) |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        tiers = " / ".join(f"{t}: {100 * a:.1f}" for t, a in row["per_tier_mean"].items())
        lines.append(
            f"| {row['bn_stats']} | {row['epochs']} | "
            f"{', '.join(pct(a) for a in row['validation_accuracy'])} | "
            f"{pct(row['mean'])} | {tiers} | {statistics.fmean(row['seconds']):.0f} |"
        )
    lines += [
        "",
        f"Chosen: **bn_stats = {best_bn}, epochs = {best_epochs}** (best mean validation "
        "accuracy).",
        "",
        "## Part B: bn_stats on Dir(0.1), 8 devices, 20 rounds (the benchmark's validation "
        "profile)",
        "",
        "| bn_stats | validation accuracy per seed | mean | seconds per run (1 thread) |",
        "|---|---|---|---|",
    ]
    for bn, c in check.items():
        lines.append(
            f"| {bn} | {', '.join(pct(a) for a in c['validation_accuracy'])} | {pct(c['mean'])} | "
            f"{statistics.fmean(c['seconds']):.0f} |"
        )
    lines.append("")
    HERE.mkdir(parents=True, exist_ok=True)
    (HERE / "results.md").write_text("\n".join(lines))
    (HERE / "results.json").write_text(
        json.dumps(
            {
                "quick": rows,
                "chosen": {"bn_stats": best_bn, "epochs": best_epochs},
                "dirichlet_check": check,
                "seeds": list(SEEDS),
                "quick_config": QUICK,
            },
            indent=1,
        )
        + "\n"
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
