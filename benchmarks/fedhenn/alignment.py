"""Does FedHeNN's alignment term move the representations? A diagnostic for the benchmark's
``fedhenn > local`` claim, on the validation split (never the test set).

    python -m benchmarks.fedhenn.alignment [--workers N]

FedHeNN adds η_t·(1 − CKA(K_j, K̄)) to each device's loss. Per round, every device reports the CKA
of its representation kernel with the round's K̄ before and after its local training
(``cka_before_mean`` / ``cka_mean`` in the server's metrics, means over the round's devices). At
η₀ = 0 the devices never see the term (their CKA is what training alone gives); at the default
0.01 and at 1 it is pulled up. If the alignment does not rise above the η₀ = 0 level, the term
does not act; if it rises and the accuracy does not, aligning the kernels does not help these
devices. The benchmark's profile (FedHeNN's five CNNs at width 0.25, 10 devices, 40 rounds at half
participation), k = 2 and k = 5, seed 0, 1,000 training images held out as the validation split.
Writes ``alignment.md`` and keeps each run under ``alignment/cells``.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from benchmarks.common import machine
from benchmarks.fedhenn import SETTINGS, make
from benchmarks.runner import Cache, Cell, run_cells
from benchmarks.sweep import commits

HERE = Path(__file__).resolve().parent
ETAS = (0.0, 0.01, 1.0)
SEED = 0


def cells() -> list[Cell]:
    template = next(c for c in make(False).cells if c.method == "fedhenn")
    out = []
    for setting in SETTINGS:
        for eta in ETAS:
            config = {**template.config, **SETTINGS[setting], "validation_samples": 1000,
                      "options": {**template.config["options"], "eta0": str(eta)}}
            out.append(Cell(f"eta0={eta:g}", f"alignment-{setting}", SEED, config, "sweep"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    todo = cells()
    config = todo[0].config
    recipe = ", ".join(f"{k} {config[k]}" for k in ("optimizer", "lr", "weight_decay",
                                                     "lr_decay_rounds") if k in config)
    before = machine()
    records = run_cells(
        todo,
        Cache(HERE / "alignment" / "cells", record_extras="benchmarks.fedhenn.extras:extras"),
        workers=args.workers,
        keep_server_metrics=("cka_mean", "cka_before_mean"),
    )
    after = machine()
    lines = [
        "# FedHeNN: does the alignment term move the representations?",
        "",
        __doc__.split("\n\n")[2].replace("\n", " "),
        "",
        "CKA: mean over the second half of the rounds (each round: mean over its devices). "
        "Accuracies on the "
        "validation split: `local` the paper's metric (each device's classes), `global` all "
        "classes.",
        "",
        f"Recipe: the benchmark's grid recipe when it ran ({recipe}); cells at "
        + ", ".join(f"`{c}` ({n})" for c, n in commits(records).items())
        + f"; load (1/5/15 min) {before['loadavg_1_5_15']} at the start ({before['date']}), "
        f"{after['loadavg_1_5_15']} at the end ({after['date']}).",
        "",
        "| setting | η₀ | CKA before training | CKA after training | local acc % | global acc % |",
        "|---|---|---|---|---|---|",
    ]
    for cell, r in zip(todo, records, strict=True):
        half = [
            p["server"]
            for p in r["per_round"][len(r["per_round"]) // 2 :]
            if "cka_mean" in p.get("server", {})
        ]
        before = statistics.fmean(h["cka_before_mean"] for h in half) if half else float("nan")
        after = statistics.fmean(h["cka_mean"] for h in half) if half else float("nan")
        lines.append(
            f"| {cell.setting.removeprefix('alignment-')} | {cell.method.removeprefix('eta0=')} | "
            f"{before:.3f} | "
            f"{after:.3f} | {100 * r['local_accuracy']:.2f} | {100 * r['final_accuracy']:.2f} |"
        )
    (HERE / "alignment.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
