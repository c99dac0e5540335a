"""How `make demo`'s data budget and learning rate were chosen: on a validation split, never the
test set.

The demo's shape is fixed by issue 14 (Velo over MQTT, ResNet10/14/18/22/26, Dir(0.5), about four
minutes on 2 cores); what is open is how to spend the compute: how many training images, how many
local epochs over them, and Adam's step size. Each candidate runs in memory (the same algorithm code
as the MQTT demo) with 2,000 of its training images held out as the validation split, 12 rounds, the
demo's 20 devices (four per depth, the paper's CIFAR-10 fleet), seed 0 and seed 1; the finalists
(the budgets that fit four minutes) also at seeds 2 and 3. The choice is the finalist with the best
mean validation accuracy over the four seeds; `results.md` beside this file records every candidate.
Seconds are wall times of one-thread runs on the shared 2-core machine, under whatever else ran then
(the CVAE-interval candidate beside a benchmark): compare them only roughly.

    python -m benchmarks.demo.tune [--workers N]
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from benchmarks.demo import FLEET
from benchmarks.runner import Cache, Cell, run_cells

HERE = Path(__file__).resolve().parent / "tune"

BASE = {
    **FLEET,
    "test_samples": 2000,
    "eval_samples": 2000,
    "eval_every": 12,
    "validation_samples": 2000,
}

#: Adam 3e-3, ×0.1 from round 10, the CVAE every second round: what the budget candidates share.
DECAY9_CVAE2 = {"lr": 3e-3, "lr_decay_rounds": (9,), "options": {"cvae_interval": "2"}}

#: label → the candidate's settings over BASE. The first four chose the budget (12k-2ep-lr3e-3); the
#: fifth adds an lr decay (×0.1 from round 10, the last quarter). Tried and dropped unfinished:
#: batch 20 with the decay (seed 0: 66.48 %, +0.74 over batch 50, in 3.1× the time: over the demo's
#: budget); BatchNorm statistics re-estimated by each device (bn_stats=recalibrate, a 4-round probe,
#: seed 0: 56.39 % against 55.94 %: the weak tier, ResNet14 at 44 %, stayed where it was).
CANDIDATES = {
    "12k-2ep-lr1e-3": {
        "train_samples": 14000,
        "epochs": 2,
        "lr": 1e-3,
    },  # the earlier demo's budget
    "24k-1ep-lr1e-3": {
        "train_samples": 26000,
        "epochs": 1,
        "lr": 1e-3,
    },  # the same sample visits over twice the images
    "12k-2ep-lr3e-3": {"train_samples": 14000, "epochs": 2, "lr": 3e-3},
    "24k-1ep-lr3e-3": {"train_samples": 26000, "epochs": 1, "lr": 3e-3},
    "12k-2ep-lr3e-3-decay9": {
        "train_samples": 14000,
        "epochs": 2,
        "lr": 3e-3,
        "lr_decay_rounds": (9,),
    },
    # the classifier also trained on the CVAE's one feature per class each step (server_feature_ce,
    # a departure: the demo's weak tiers lack classes their depth group has almost no images of)
    "decay9-sfce0.5": {
        "train_samples": 14000,
        "epochs": 2,
        "lr": 3e-3,
        "lr_decay_rounds": (9,),
        "options": {"server_feature_ce": "0.5"},
    },
    "decay9-sfce2": {
        "train_samples": 14000,
        "epochs": 2,
        "lr": 3e-3,
        "lr_decay_rounds": (9,),
        "options": {"server_feature_ce": "2"},
    },
    # the CVAE trained every second round, not every round (the paper's Table 4: intervals of 1–10
    # rounds barely matter): half the server's work per round (issue 22's server share)
    "decay9-cvae2": {**DECAY9_CVAE2, "train_samples": 14000, "epochs": 2},
    # six devices per depth instead of four: the same images and compute spread over more devices,
    # so each depth group's union of Dir(0.5) shares covers the classes more evenly
    "decay9-cvae2-30dev": {**DECAY9_CVAE2, "clients": 30, "train_samples": 14000, "epochs": 2},
    # more local training per round: device training is about 5 s of a 10 s MQTT round at the
    # chosen budget (the rest is start-up, the CVAE and evaluation), so the demo can afford more
    "decay9-cvae2-3ep": {**DECAY9_CVAE2, "train_samples": 14000, "epochs": 3},
    "decay9-cvae2-24k-2ep": {**DECAY9_CVAE2, "train_samples": 26000, "epochs": 2},
    "decay9-cvae2-18k-2ep": {**DECAY9_CVAE2, "train_samples": 20000, "epochs": 2},
    "decay9-cvae2-18k-3ep": {**DECAY9_CVAE2, "train_samples": 20000, "epochs": 3},
    # the chosen budget at batch 100: these narrow ResNets are bound by per-step overhead on a CPU
    # (one thread: ResNet10 1,815 → 3,203 images/s, ResNet26 1,162 → 1,847 from batch 50 to 100), so
    # the same epochs cost about 0.6 of the time; at Adam's lr and at ×√2 of it for the halved steps
    "decay9-cvae2-18k-3ep-b100": {
        **DECAY9_CVAE2,
        "train_samples": 20000,
        "epochs": 3,
        "batch_size": 100,
    },
    "decay9-cvae2-18k-3ep-b100-lr4e-3": {
        **DECAY9_CVAE2,
        "train_samples": 20000,
        "epochs": 3,
        "batch_size": 100,
        "lr": 4.2e-3,
    },
}
SEEDS = (0, 1)
#: The second stage: the budgets that fit the demo's four minutes once device processes are forked
#: from a preloaded fork server (the MQTT demo at 12k-2ep took 114 s, of which device training is
#: about 5 s a round), run at two more seeds. A candidate's images change its Dirichlet partition,
#: and the partition moves a seed's accuracy by several points (12k-2ep: 66 and 73 %), so two seeds
#: cannot rank budgets a point or two apart; the choice is the best mean over all four.
FINALISTS = (
    "decay9-cvae2",
    "decay9-cvae2-3ep",
    "decay9-cvae2-18k-2ep",
    "decay9-cvae2-24k-2ep",
    "decay9-cvae2-18k-3ep",
    "decay9-cvae2-18k-3ep-b100",
    "decay9-cvae2-18k-3ep-b100-lr4e-3",
)
FINAL_SEEDS = (0, 1, 2, 3)
#: options that are the paper's own knobs (its Table 4 varies the CVAE's interval), not departures
PAPER_OPTIONS = {"cvae_interval"}


def cells(labels=None) -> list[Cell]:
    out = []
    for label, settings in CANDIDATES.items():
        if labels and label not in labels:
            continue
        for seed in FINAL_SEEDS if label in FINALISTS else SEEDS:
            out.append(Cell(label, "demo-dir0.5-validation", seed, {**BASE, **settings}, "sweep"))
    return out


def describe(settings: dict) -> str:
    merged = {**BASE, "batch_size": 50, **settings}
    decay = ", ".join(str(r + 1) for r in merged.get("lr_decay_rounds", ())) or "none"
    return (
        f"{merged['clients']} | {merged['train_samples']:,} | {merged['epochs']} | "
        f"{merged['batch_size']} | "
        f"{merged['lr']:g} | {decay} | "
        f"{', '.join(f'{k}={v}' for k, v in merged.get('options', {}).items()) or '—'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--only", nargs="*", help="run only these candidates (the page lists every cached one)"
    )
    args = parser.parse_args()
    todo = cells(args.only)
    if args.only:
        run_cells(todo, Cache(HERE / "cells"), workers=args.workers)
    cache = Cache(HERE / "cells")
    todo = [c for c in cells() if cache.get(c) is not None]
    records = run_cells(todo, cache, workers=args.workers)
    by_label: dict[str, list[dict]] = {}
    for cell, record in zip(todo, records, strict=True):
        by_label.setdefault(cell.method, []).append(record)
    lines = [
        "# How the demo's budget was chosen (validation split)",
        "",
        __doc__.split("\n\n")[1].replace("\n", " "),
        "",
        "| candidate | devices | train images (2,000 held out) | epochs | batch | lr | ×0.1 at "
        "round | options | validation accuracy per seed | mean, seeds 0 and 1 | mean, seeds 0–3 | "
        "seconds per run (1 core) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    first, final = {}, {}
    for label, records in by_label.items():
        accs = {r["seed"]: r["final_accuracy"] for r in records}
        first[label] = statistics.fmean(accs[s] for s in SEEDS)
        if set(FINAL_SEEDS) <= set(accs):
            final[label] = statistics.fmean(accs[s] for s in FINAL_SEEDS)
        secs = statistics.fmean(r["wall_seconds"] for r in records)
        four = f"{100 * final[label]:.2f} %" if label in final else "—"
        lines.append(
            f"| {label} | {describe(CANDIDATES[label])} | "
            + ", ".join(f"{100 * accs[s]:.2f} %" for s in sorted(accs))
            + f" | {100 * first[label]:.2f} % | {four} | {secs:.0f} |"
        )
    faithful = {
        k: v for k, v in final.items() if set(CANDIDATES[k].get("options", {})) <= PAPER_OPTIONS
    }
    best = max(faithful, key=faithful.get)
    lines += [
        "",
        f"Chosen: **{best}** (the best mean validation accuracy over seeds 0–3 among the "
        "finalists, which run the "
        "paper's Velo).",
        "",
    ]
    departures = {
        k: v for k, v in first.items() if set(CANDIDATES[k].get("options", {})) - PAPER_OPTIONS
    }
    if departures:
        top = max(departures, key=departures.get)
        lines += [
            "Options of ours (departures from the paper; `options` column), on seeds 0 and 1: "
            f"the best, {top}, is "
            f"{100 * (departures[top] - first[best]):+.2f} points over the chosen candidate. The "
            "demo "
            "shows the paper's method, so a departure would have to buy more than the seeds' "
            "spread to replace it.",
            "",
        ]
    (HERE / "results.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
