"""FedHeNN's k = 2 recipe, chosen for stability on a validation split (issue 37).

In the committed k = 2 cells about 40–50 % of the devices sit at 0.50 on their 2-class local split
(one class predicted), in Local and FedHeNN alike, under the benchmark's recipe: SGD lr 0.05,
momentum 0.9, weight decay 1e-4, batch 32, ×0.1 at 40 % and 70 % of the rounds. This sweep runs
Local and FedHeNN at k = 2 on the benchmark's profile (FedHeNN's five CNNs at width 0.25, ten
devices of about 500 images, 40 rounds at half participation) with 1,000 of the 6,000 training
images held out as the validation split (the test set is never read), over five seeds the
benchmark does not use, for each candidate recipe:

- **sgd 0.05 m0.9**: the benchmark's recipe until now;
- **sgd 0.01 m0.9**: the CNN family's default (``edgefl.algorithms.fedavg.CNN_RECIPE``, chosen by
  benchmarks/foundation/recipes.py for FedAvg and Local on the tier-2 CNN);
- **adam 1e-3**: added after the first two candidates' Local runs had all collapsed somewhere (lr
  0.05: seed 10, two devices; lr 0.01: seed 14, the tier-5 device holding pullover and shirt, its
  training loss at ln 2 for 20 epochs), because one device at a time (``collapse.py --stuck``)
  every such device learned at Adam lr 1e-3; the rule below unchanged.

Everything else (batch, weight decay, schedule) stays as the benchmark has it.

The rule, fixed before the runs: a recipe is *stable* when none of its runs collapses (the
runner's gate, :func:`benchmarks.gates.run_collapse`: accuracy within 5 points of chance, or a
device predicting one class while it holds two or more, *measured* from each device's
predictions); among the stable recipes the chosen one has the highest mean validation
``local_accuracy`` (the paper's metric: each device's per-class accuracy weighted by its training
label distribution), Local's and FedHeNN's means averaged.

The cells run in the order that decides the rule soonest: the current recipe's Local at the first
seed (where its collapse showed), then every cell of the other candidate, then the rest; once the
rule is decided the remaining cells may be left unrun, and the page lists them.

Run it at a clean commit with ``nice -n 5 python -m benchmarks.fedhenn.recipes --workers 2``
(``--report-only`` rewrites recipes.json/recipes.md from the cached cells). Cells are cached in
``recipes_cells/`` like a benchmark's.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from benchmarks import gates, sweep
from benchmarks.cache import Cache
from benchmarks.cells import Cell
from benchmarks.common import decay_rounds
from benchmarks.fedhenn import HETERO, SETTINGS, profile

HERE = Path(__file__).resolve().parent
EXTRAS = "benchmarks.fedhenn.extras:extras"
SEEDS = (10, 11, 12, 13, 14)  # not the benchmark's seeds
CURRENT = "sgd 0.05 m0.9"
CANDIDATES = {
    "sgd 0.01 m0.9": {"optimizer": "sgd", "lr": 0.01, "momentum": 0.9},
    CURRENT: {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9},
    "adam 1e-3": {"optimizer": "adam", "lr": 0.001},
}
METHODS = {"local": {}, "fedhenn": {"rad_size": "100"}}


def cells() -> list[Cell]:
    """Every cell, in the order that decides the rule soonest (the module's docstring)."""
    # the base each candidate overrides, as the sweep ran it (SGD 0.01 m0.9; Adam does not read the
    # momentum it leaves), whatever recipe the benchmark declares since
    base = {**profile(False), **CANDIDATES["sgd 0.01 m0.9"], **SETTINGS["k2"],
            "validation_samples": 1000, "tiers": HETERO}
    base["lr_decay_rounds"] = decay_rounds(base["rounds"])
    every = [
        Cell(
            f"{method} {name}",
            "k2",
            seed,
            {**base, **recipe, "algorithm": method, "options": options},
            role="sweep",
        )
        for name, recipe in CANDIDATES.items()
        for method, options in METHODS.items()
        for seed in SEEDS
    ]
    first = [c for c in every if c.method == f"local {CURRENT}" and c.seed == SEEDS[0]]
    others = [c for c in every if not c.method.endswith(CURRENT)]
    return list(dict.fromkeys(first + others + every))


def summarize(records: list[dict | None], every: list[Cell]) -> dict:
    """Per recipe and method: validation local accuracy, collapsed runs and devices; each recipe's
    status (stable, unstable, undecided) and the chosen one."""
    done = {c: r for c, r in zip(every, records, strict=True) if r is not None}
    rows, status, score = [], {}, {}
    for name in CANDIDATES:
        means, bad, complete = [], False, True
        for method in METHODS:
            planned = [c for c in every if c.method == f"{method} {name}"]
            rs = [done[c] for c in planned if c in done]
            complete = complete and len(rs) == len(planned)
            why = {r["seed"]: w for r in rs if (w := gates.run_collapse(r))}
            bad = bad or bool(why)
            local = [r["local_accuracy"] for r in rs]
            means.append(statistics.fmean(local) if local else None)
            rows.append({
                "recipe": name, "method": method, "planned": len(planned),
                "seeds": [r["seed"] for r in rs], "local": local,
                "devices": sum(len(r["client_local_accuracy"]) for r in rs),
                "collapsed_devices": sum(len(gates.collapsed_devices(r)[0]) for r in rs),
                "slope": [r.get("slope") for r in rs], "unstable": why,
            })
        status[name] = "unstable" if bad else "stable" if complete else "undecided"
        score[name] = statistics.fmean(means) if None not in means else None
    stable = [n for n in CANDIDATES if status[n] == "stable"]
    best = max(stable, key=score.__getitem__) if stable else None
    chosen = best if best and all(status[n] != "undecided" for n in CANDIDATES) else None
    pairs, devices = {}, {}  # FedHeNN − Local per seed and per device, at each recipe
    for name in CANDIDATES:
        by = {(c.method, c.seed): done[c] for c in every if c in done and c.method.endswith(name)}
        both = [(by[(f"fedhenn {name}", s)], by[(f"local {name}", s)]) for s in SEEDS
                if (f"fedhenn {name}", s) in by and (f"local {name}", s) in by]
        pairs[name] = {f["seed"]: f["local_accuracy"] - lo["local_accuracy"] for f, lo in both}
        every_, kept = [], []  # every device; the devices predicting two classes in both runs
        for f, lo in both:
            fallen = set(gates.collapsed_devices(f)[0]) | set(gates.collapsed_devices(lo)[0])
            for d, acc in f["client_local_accuracy"].items():
                every_.append(acc - lo["client_local_accuracy"][d])
                if d not in fallen:
                    kept.append(every_[-1])
        devices[name] = {"every": every_, "kept": kept}
    return {"rows": rows, "status": status, "score": score, "chosen": chosen,
            "chosen_recipe": CANDIDATES.get(chosen), "fedhenn_minus_local": pairs,
            "fedhenn_minus_local_devices": devices,
            "not_run": [c.label for c in every if c not in done]}


def pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.2f}"


def markdown(result: dict) -> str:
    chosen = (f"**Chosen: {result['chosen']}** ({json.dumps(result['chosen_recipe'])})."
              if result["chosen"] else "**Not decided yet.**"
              if "undecided" in result["status"].values() else "**No candidate is stable.**")
    lines = ["# FedHeNN's k = 2 recipe: a stability sweep on a validation split", "",
             (__doc__ or "").split("\n\n", 1)[1].split("\n\nRun it")[0], "", chosen, "",
             "| recipe | method | runs | val. local acc % (mean ± sd) | per seed | devices "
             "predicting one class | collapsed runs |", "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        why = "; ".join(f"seed {s}: {', '.join(w)}" for s, w in r["unstable"].items()) or "none"
        xs = r["local"]
        ms = (f"{pct(statistics.fmean(xs))} ± {pct(statistics.stdev(xs) if len(xs) > 1 else 0)}"
              if xs else "—")
        per = ", ".join(f"s{s} {pct(x)}" for s, x in zip(r["seeds"], xs, strict=True))
        lines.append(f"| {r['recipe']} | {r['method']} | {len(xs)} of {r['planned']} | "
                     f"{ms} | {per or '—'} | {r['collapsed_devices']} of "
                     f"{r['devices']} | {why} |")
    lines += ["", "| recipe | status | mean of Local's and FedHeNN's val. local acc % | "
              "FedHeNN − Local per seed (points) |", "|---|---|---|---|"]
    for n in CANDIDATES:
        d = result["fedhenn_minus_local"][n]
        diffs = ", ".join(f"s{s} {100 * x:+.2f}" for s, x in d.items()) or "—"
        if len(d) > 1:
            diffs += (f" (mean {100 * statistics.fmean(d.values()):+.2f} ± "
                      f"{100 * statistics.stdev(d.values()):.2f})")
        lines.append(f"| {n} | {result['status'][n]} | {pct(result['score'][n])} | {diffs} |")
    lines += ["", "FedHeNN − Local per device (paired by seed and device; validation local "
              "accuracy, points): over every device, and over the devices that predict two "
              "classes in both runs.", "", "| recipe | every device | neither collapsed |",
              "|---|---|---|"]
    for n, d in result["fedhenn_minus_local_devices"].items():
        cols = [f"{len(xs)} devices, {100 * statistics.fmean(xs):+.2f} ± "
                f"{100 * statistics.stdev(xs):.2f}" if len(xs) > 1 else "—"
                for xs in (d["every"], d["kept"])]
        lines.append(f"| {n} | {cols[0]} | {cols[1]} |")
    if result["not_run"]:
        lines += ["", f"Not run ({len(result['not_run'])} cells; the rule was decided without "
                  "them, or the run is unfinished): "
                  + ", ".join(f"`{x}`" for x in result["not_run"]) + "."]
    lines += sweep.provenance(result, f"{sweep.cell_minutes(result)} (one torch thread per cell, "
                              "on a machine shared with other work).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    p = sweep.parser("FedHeNN's k = 2 recipe: a stability sweep.")
    p.add_argument("--candidates", help="run only these candidates' cells (comma-separated "
                   "names; the report still reads every cached cell)")
    p.add_argument("--started", help="with --report-only and no recipes.json: when the run "
                   "started and the load then, as the page should say it")
    args = p.parse_args(argv)
    cache = Cache(HERE / "recipes_cells", EXTRAS, draft=args.draft)
    every = cells()
    previous = HERE / "recipes.json"
    before = sweep.machine_before(previous)
    if args.started:
        before = {"cores": before.get("cores"), "started": args.started}
    chosen = set(args.candidates.split(",")) if args.candidates else set(CANDIDATES)
    records = sweep.records(every, cache, report_only=args.report_only, workers=args.workers,
                            tmp_root=HERE / "recipes_tmp",
                            run=[c for c in every if c.method.split(" ", 1)[1] in chosen])
    result = sweep.finish(
        summarize(records, every), [r for r in records if r is not None],
        command="nice -n 5 python -m benchmarks.fedhenn.recipes --workers 2", before=before,
        after=sweep.machine_after(previous, args.report_only),
        keys=("method", "setting", "seed", "final_accuracy", "slope", "local_accuracy",
              "client_local_accuracy", "client_predictions", "code", "code_hash", "config"))
    sweep.write(HERE, "recipes", result, markdown)
    print(f"chosen: {result['chosen']} {result['chosen_recipe']}; {HERE / 'recipes.md'}")
    return result


if __name__ == "__main__":
    main()
