"""Local's recipe on the 1,000-device fleet, chosen on a validation split (issue 37).

In the committed grid (ee89a37) Local on ``fleet1000`` (FedAvg's CNN tier 2 at width 0.25 on each
device alone, about 60 images a device, one local epoch of batch 32 per round, 16 rounds, SGD lr
0.05 with the ÷10 from round 11) collapsed in all three seeds: 2, 5 and 2 of 1,000 devices predict
one class while holding two or more (their shards of 19–70 images give one or two SGD steps a
round, 16–32 over the run), and its last-quarter slope is 1.32 / 0.84 points per 10 % of rounds
(still rising, far from the runner's 0.5). A baseline the claim ``fedavg ε=8 > local`` compares
against must be trained to its own plateau: this sweep gives Local the steps its shards need,
on a validation split (the test set is never read), before the grid's Local cells run again.

The sweep's fleet: 200 devices over 11,800 training images (59 a device, as the 1,000-device
fleet's 59,000 over 1,000: Local's devices are independent of each other, so 200 devices per
seed over five seeds are 1,000 device-runs per candidate at a fifth of a cell's cost), Dir(0.5),
the smallest shard 10 images, 1,000 training images held out as the validation split (the
evaluation set), the grid's 16 rounds and schedule, seeds 10–14 (not the benchmark's). The
candidates, each a whole recipe (epochs a round, batch, lr; SGD momentum 0.9 as the grid):

- **e1 b32 lr0.05**: the grid's recipe until now;
- **e4 b32 lr0.05**: four epochs a round (4× the steps and the compute);
- **e1 b8 lr0.01**: batch 8 (4× the steps at about the same compute), the lr scaled with the batch
  (0.05 × 8/32 ≈ 0.01, the CNN family's default, ``edgefl.algorithms.fedavg.CNN_RECIPE``);
- **e4 b8 lr0.01**: both (16× the steps).

The rule, fixed before the runs: a candidate is *eligible* when its seed-10 cell's CPU time (the
cell's process, one torch thread: its cost whatever else the machine runs) is at most 2.9× the
grid recipe's seed-10 CPU time: the grid's three Local cells took about 370 s each, and at 2.9×
they add at most 3 × 1.9 × 370 / 2 ≈ 1,050 s at 2 workers to its 39.5-minute regeneration,
keeping it under the hour; an ineligible candidate's other seeds are not run. An eligible
candidate is *stable* when none of its runs collapses (the runner's gate,
:func:`benchmarks.gates.run_collapse`: within 5 points of chance, or a device predicting one class
while it holds two or more, measured from each device's predictions) and *converged* when every
run's last-quarter slope is under 0.5 points per 10 % of rounds (the runner's limit). Among the
stable, converged candidates the chosen one has the highest mean validation accuracy over its
seeds. If none qualifies, the grid keeps its recipe and the page says why.

Run it at a clean commit with ``nice -n 5 python -m benchmarks.privacy.local_recipe --workers 2``
(``--report-only`` rewrites local_recipe.json/.md from the cached cells in
``local_recipe_cells/``).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks import gates, sweep
from benchmarks.cache import Cache
from benchmarks.cells import Cell
from benchmarks.privacy import FEDAVG, LOCAL_EVAL, fleet_profile
from benchmarks.privacy.felo_recipe import failed_rounds

HERE = Path(__file__).resolve().parent
SEEDS = (10, 11, 12, 13, 14)  # not the benchmark's seeds
CURRENT = "e1 b32 lr0.05"
CANDIDATES = {
    CURRENT: {"epochs": 1, "batch_size": 32, "lr": 0.05},
    "e4 b32 lr0.05": {"epochs": 4, "batch_size": 32, "lr": 0.05},
    "e1 b8 lr0.01": {"epochs": 1, "batch_size": 8, "lr": 0.01},
    "e4 b8 lr0.01": {"epochs": 4, "batch_size": 8, "lr": 0.01},
}
DEVICES = 200
IMAGES = 59  # a device's share of the 1,000-device fleet's 59,000 training images
VALIDATION = 1000
#: the most a candidate's seed-10 CPU time may be, a multiple of the grid recipe's (the docstring)
COST_LIMIT = 2.9
SLOPE_LIMIT = 0.5


@dataclass(frozen=True)
class Spec:
    """One sweep of Local's recipe: its files' name, its page's title and text (its docstring,
    the rule), its candidates (the grid's own first: ``current``), the cost limit, its cells (the
    first seed's decide eligibility) and its command."""

    name: str
    title: str
    doc: str
    candidates: dict[str, dict]
    current: str
    cost_limit: float
    cells: Callable[[], list[Cell]]
    command: str
    seeds: tuple[int, ...] = SEEDS
    #: the rule's convergence over a candidate's run slopes (default: every run under the limit)
    converged: Callable[[list[float | None]], bool] = (
        lambda slopes: all(s is not None and s < SLOPE_LIMIT for s in slopes))


def cells() -> list[Cell]:
    """Every candidate's cells, seed 10 first (they decide eligibility)."""
    base = {**fleet_profile(False), **FEDAVG, "algorithm": "local", "options": {},
            "clients": DEVICES, "train_samples": DEVICES * IMAGES,
            "validation_samples": VALIDATION, "min_size": 10, "eval_samples": LOCAL_EVAL}
    every = [Cell(name, "fleet200-validation", s, {**base, **recipe}, role="sweep")
             for s in SEEDS for name, recipe in CANDIDATES.items()]
    return every


def summarize(records: list[dict | None], every: list[Cell], spec: Spec) -> dict:
    """Per candidate: eligibility, validation accuracies, collapsed devices and runs, slopes;
    the chosen candidate (None while undecided or when none qualifies)."""
    done = {c: r for c, r in zip(every, records, strict=True) if r is not None}
    first = {c.method: done.get(c) for c in every if c.seed == spec.seeds[0]}
    ref = first.get(spec.current)
    rows, status = [], {}
    for name in spec.candidates:
        planned = [c for c in every if c.method == name]
        rs = [done[c] for c in planned if c in done]
        cost = (first[name]["cpu_seconds"] / ref["cpu_seconds"]
                if ref is not None and first.get(name) is not None else None)
        collapsed = {r["seed"]: w for r in rs if (w := gates.run_collapse(r))}
        slopes = [r.get("slope") for r in rs]
        if cost is not None and cost > spec.cost_limit:
            state = "ineligible (cost)"
        elif collapsed:
            state = "unstable"
        elif not spec.converged(slopes):
            state = "not converged"
        elif len(rs) < len(planned) or cost is None:
            state = "undecided"
        else:
            state = "stable, converged"
        status[name] = state
        rows.append({
            "recipe": name, "settings": spec.candidates[name], "planned": len(planned),
            "seeds": [r["seed"] for r in rs], "accuracy": [r["final_accuracy"] for r in rs],
            "slope": slopes, "cost_vs_current": cost,
            "devices": sum(len(r.get("client_accuracy", {})) for r in rs),
            "collapsed_devices": sum(len(gates.collapsed_devices(r)[0]) for r in rs),
            # shown, not part of the rule: device-rounds whose local work diverged (refused)
            "lost_device_rounds": {r["seed"]: n for r in rs if (n := failed_rounds(r))},
            "collapsed_runs": collapsed, "status": state,
            "wall_seconds": [r["wall_seconds"] for r in rs],
        })
    good = [r for r in rows if r["status"] == "stable, converged"]
    decided = all(s != "undecided" for s in status.values())
    chosen = (max(good, key=lambda r: statistics.fmean(r["accuracy"]))["recipe"]
              if good and decided else None)
    return {"rows": rows, "status": status, "chosen": chosen,
            "chosen_recipe": spec.candidates.get(chosen) if chosen else None,
            "not_run": [c.label for c in every if c not in done]}


def lost_text(lost: dict) -> str:
    """"none", or each seed's device-rounds lost ("s12: 10")."""
    return ", ".join(f"s{seed}: {n}" for seed, n in lost.items()) or "none"


def pct(x: float) -> str:
    return f"{100 * x:.2f}"


def markdown(result: dict, spec: Spec) -> str:
    lines = sweep.opening(result, f"# {spec.title}: a sweep on a validation split", spec.doc,
                          "**No candidate qualifies**: the grid keeps its recipe.")
    lines += ["| recipe | runs | CPU vs the grid's recipe (seed 10) | val. acc % (mean ± sd) | "
              "per seed | last-quarter slope per seed | devices predicting one class | "
              "device-rounds lost | status |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        xs = r["accuracy"]
        ms = (f"{pct(statistics.fmean(xs))} ± {pct(statistics.stdev(xs) if len(xs) > 1 else 0)}"
              if xs else "—")
        per = ", ".join(f"s{s} {pct(x)}" for s, x in zip(r["seeds"], xs, strict=True)) or "—"
        slopes = ", ".join("—" if s is None else f"{s:.2f}" for s in r["slope"]) or "—"
        cost = "—" if r["cost_vs_current"] is None else f"{r['cost_vs_current']:.2f}×"
        lines.append(f"| {r['recipe']} | {len(xs)} of {r['planned']} | {cost} | {ms} | {per} | "
                     f"{slopes} | {r['collapsed_devices']} of {r['devices']} | "
                     f"{lost_text(r['lost_device_rounds'])} | {r['status']} |")
    if result["not_run"]:
        lines += ["", f"Not run ({len(result['not_run'])} cells: an ineligible candidate's "
                  "other seeds, or an unfinished run): "
                  + ", ".join(f"`{x}`" for x in result["not_run"]) + "."]
    lines += sweep.provenance(result, f"{sweep.cell_minutes(result)} (one torch thread per cell, "
                              "2 workers).")
    return "\n".join(lines)


def main(argv: list[str] | None = None, spec: Spec | None = None) -> dict:
    spec = spec or FLEET
    args = sweep.parser(f"{spec.title}: a validation sweep.").parse_args(argv)
    cache = Cache(HERE / f"{spec.name}_cells", draft=args.draft)
    every = spec.cells()
    previous = HERE / f"{spec.name}.json"
    before = sweep.machine_before(previous)
    first = [c for c in every if c.seed == spec.seeds[0]]
    tmp = HERE / f"{spec.name}_tmp"
    records = sweep.records(every, cache, report_only=args.report_only, workers=args.workers,
                            tmp_root=tmp, run=first)
    eligible = {r["recipe"] for r in summarize(records, every, spec)["rows"]
                if not r["status"].startswith("ineligible")}
    records = sweep.records(every, cache, report_only=args.report_only, workers=args.workers,
                            tmp_root=tmp, run=[c for c in every if c.method in eligible])
    result = sweep.finish(
        summarize(records, every, spec), [r for r in records if r is not None],
        command=spec.command, before=before,
        after=sweep.machine_after(previous, args.report_only),
        keys=("method", "setting", "seed", "final_accuracy", "slope", "client_accuracy",
              "client_class_counts", "client_predictions", "code", "code_hash", "config"))
    sweep.write(HERE, spec.name, result, lambda r: markdown(r, spec))
    print(f"chosen: {result['chosen']} {result['chosen_recipe']}; {HERE / (spec.name + '.md')}")
    return result


#: the sweep of this module's docstring: Local on the 1,000-device fleet
FLEET = Spec("local_recipe", "Local's recipe on the 1,000-device fleet", __doc__, CANDIDATES,
             CURRENT, COST_LIMIT, cells,
             "nice -n 5 python -m benchmarks.privacy.local_recipe --workers 2")


if __name__ == "__main__":
    main()
