"""Does the benchmark's cheaper model keep its bounds? A check on a validation split, committed with
its rule before it runs (issue 37).

The profile declared for the one-hour rule runs the depth tiers with the CIFAR stem's conv at stride
2 (``stem=stride2``, :data:`benchmarks.hierarchyfl.STEM`), about a third of the CPU cost of the
stride-1 stem every earlier cell ran with. It was chosen for its cost alone, before any cell of it
ran. What could make it unusable is the runner's gates: Local-IID must reach 75 % and the
centralized bound must stay above it. The earlier (stride-1) runs had Local-IID at 77.1–78.5 % on
the test set, centralized 86–88 % per tier.

The check: the declared profile's bounds (Local on IID shards, eight devices; one device on the
union, tiers 1 and 4), 32 rounds with the ×0.1 steps, on a validation split of 1,000 images carved
from the training images (the test set is never read), seeds 10–12 (not the benchmark's seeds);
the centralized runs seed 10.

The rule, fixed before the runs: the stride-2 stem **passes** when no run collapses
(:func:`benchmarks.gates.run_collapse`), Local-IID's mean validation accuracy is ≥ 76 % (the
gate's 75 % and a point for the split), each centralized tier ends above Local-IID's mean, and
every setting's mean last-quarter slope is under 0.5 points per 10 % of rounds. Passes: the
declared profile runs as declared. Fails: it is not run, and the page says so.

Run it at a clean commit with ``nice -n 5 python -m benchmarks.hierarchyfl.stem_check --workers 2``
(about 5 minutes on an idle machine; ``--report-only`` rewrites stem_check.json/.md from the cached
cells).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks import gates, sweep
from benchmarks.cells import Cell

HERE = Path(__file__).resolve().parent
SEEDS = (10, 11, 12)
LOCAL_MIN = 0.76


def cells() -> list[Cell]:
    from benchmarks.hierarchyfl import RECHECKED_AT, make

    bench = make(False)
    pinned = {"validation_samples": 1000, **RECHECKED_AT}  # it ran the 32-round profile
    out = []
    for c in bench.bounds["local_iid"][:1]:
        for seed in SEEDS:
            out.append(Cell("local", "local iid", seed, {**c.config, **pinned}, role="sweep"))
    for c in bench.bounds["centralized"]:
        tier = c.config["tiers"][0]
        if tier in ("1", "4"):
            out.append(Cell("local", f"centralized tier {tier}", SEEDS[0],
                            {**c.config, **pinned}, role="sweep"))
    return out


def summarize(records: list[dict | None], every: list[Cell]) -> dict:
    rows, why, complete = [], [], True
    means = {}
    for setting in dict.fromkeys(c.setting for c in every):
        rs = [r for r, c in zip(records, every, strict=True)
              if r is not None and c.setting == setting]
        complete = complete and len(rs) == sum(c.setting == setting for c in every)
        finals = [r["final_accuracy"] for r in rs]
        means[setting] = statistics.fmean(finals) if finals else None
        slope = statistics.fmean(r["slope"] for r in rs) if rs else None
        why += [f"{setting} seed {r['seed']}: {', '.join(u)}" for r in rs
                if (u := gates.run_collapse(r))]
        if slope is not None and slope >= 0.5:
            why.append(f"{setting}: mean slope {slope:.2f} ≥ 0.5")
        rows.append({"setting": setting, "seeds": [r["seed"] for r in rs], "final": finals,
                     "mean": means[setting], "slope": slope})
    local = means.get("local iid")
    if local is not None and local < LOCAL_MIN:
        why.append(f"Local-IID {100 * local:.2f} % < {100 * LOCAL_MIN:.0f} %")
    for setting, m in means.items():
        if setting.startswith("centralized") and None not in (m, local) and m <= local:
            why.append(f"{setting} {100 * m:.2f} % not above Local-IID {100 * local:.2f} %")
    status = "fails" if why else "passes" if complete else "undecided"
    return {"rows": rows, "why": why, "status": status,
            "chosen": "stride2" if status == "passes" else None}


def pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.2f}"


def row_cells(r: dict) -> str:
    """A setting's table cells: its runs, final validation accuracy per seed, mean and slope."""
    per = ", ".join(f"s{s} {pct(f)}" for s, f in zip(r["seeds"], r["final"], strict=True))
    slope = "—" if r["slope"] is None else f"{r['slope']:.2f}"
    return f"{len(r['seeds'])} | {per or '—'} | {pct(r['mean'])} | {slope}"


def markdown(result: dict) -> str:
    lines = ["# HierarchyFL's stride-2 stem: the bounds on a validation split", "",
             (__doc__ or "").split("\n\n", 1)[1].split("\n\nRun it")[0], "",
             f"**Verdict: {result['status']}**" + (
                 f" ({'; '.join(result['why'])})" if result["why"] else ""), "",
             "| setting | runs | final val. acc % per seed | mean % | last-quarter slope |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['setting']} | {row_cells(r)} |" for r in result["rows"]]
    return "\n".join(lines + sweep.provenance(result, sweep.cell_minutes(result) + " in all."))


def main(argv: list[str] | None = None) -> dict:
    return sweep.main(argv, "HierarchyFL's stride-2 stem: the bounds on a validation split "
                      "(issue 37).", HERE, "stem_check", cells, summarize, markdown,
                      command="nice -n 5 python -m benchmarks.hierarchyfl.stem_check --workers 2",
                      keys=("method", "setting", "seed", "final_accuracy", "per_round", "slope",
                            "code", "code_hash"))


if __name__ == "__main__":
    main()
