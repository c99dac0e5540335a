"""Felo's local gradient clip under local DP, chosen on a validation split (issue 37).

In the committed grid (cells of 8208785) ``felo ε=1`` seed 2 collapsed: device d00 (classes 1, 3
and 4; 364 images) predicts one class. Rerun with the cell's settings, its local work diverged in
round 3: from the first distilling round its weights grew every step (the largest from 0.36 to
2.4 in 20 steps, where at ε = 4 they settle at 0.6), the gradients of cross-entropy and of the
KL term toward the server's per-class logits both 5–16 and opposed (at ε = 1 the noisy class
means, projected onto the clip ball, point nowhere in particular, so the teacher's class is
often not the label), until a step of gradient norm 33 and then 94 threw the model off (logits
1e3 at the round's end, non-finite from round 4: every later upload refused). Scaling each
step's gradient down to a norm of 10 or 5 (``--max-grad-norm``, ``edgefl.algorithms.training.
optimizer_step``) let the same cell train on (47.3 / 47.6 % against 45.6 %, read only to see that
it trains: the choice below never reads the test set).

The sweep: Felo as the grid runs it (``dir0.5``: 10 devices, Dir(0.5), 16 rounds; the grid's
three CNN tiers at width 0.25, SGD 0.05 at batch 32, knowledge only) at ε = 1 (the noisiest
teacher) and ε = ∞ (no noise: what a clip costs the method without DP), with 1,000 training
images held out as the validation split (the evaluation set; the test set is never read), seeds
10–14 (not the benchmark's). The candidates: no clip (the grid's recipe until now), and a clip
of 10, 5 or 2.

The rule, fixed before the runs: a candidate is *stable* when none of its runs collapses (the
runner's gate, :func:`benchmarks.gates.run_collapse`) and no device of any run lost a round's
work (a refused non-finite upload). Among the stable candidates the chosen one has the highest
mean validation accuracy over all its runs (both ε). If none is stable, the grid keeps its
recipe and the page says why. The chosen clip applies to every Felo cell of the grid (each ε and
∞); FedProto and Local keep their recipes (they never diverged: no distillation term).

Run it at a clean commit with ``nice -n 5 python -m benchmarks.privacy.felo_recipe --workers 2``
(``--report-only`` rewrites felo_recipe.json/.md from the cached cells in ``felo_recipe_cells/``).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks import gates, sweep
from benchmarks.cells import Cell
from benchmarks.privacy import FELO, SETTING, options, profile

HERE = Path(__file__).resolve().parent
SEEDS = (10, 11, 12, 13, 14)  # not the benchmark's seeds
EPSILONS = (1, None)  # None: ε = ∞, no DP
VALIDATION = 1000
CURRENT = "no clip"
CANDIDATES = {CURRENT: None, "clip 10": 10.0, "clip 5": 5.0, "clip 2": 2.0}


def eps_name(epsilon: float | None) -> str:
    return "∞" if epsilon is None else str(epsilon)


def cells() -> list[Cell]:
    base = {**profile(False), **FELO, "validation_samples": VALIDATION}
    return [
        Cell(f"{name} ε={eps_name(e)}", f"{SETTING}-validation", s,
             {**base, "max_grad_norm": clip, "options": options("felo", e)}, role="sweep")
        for name, clip in CANDIDATES.items() for e in EPSILONS for s in SEEDS
    ]


def failed_rounds(record: dict) -> int:
    """Device-rounds whose work the run lost."""
    return sum(len(r.get("failed", ())) for r in record.get("per_round", ()))


def summarize(records: list[dict | None], every: list[Cell]) -> dict:
    """Per candidate: its runs' validation accuracies (per ε), collapsed runs, lost device-rounds
    and stability; the chosen candidate (None while undecided or when none is stable)."""
    done = {c: r for c, r in zip(every, records, strict=True) if r is not None}
    rows, status = [], {}
    for name, clip in CANDIDATES.items():
        planned = [c for c in every if c.method.startswith(name + " ")]
        rs = [(c, done[c]) for c in planned if c in done]
        collapsed = {f"{c.method.split(' ', 2)[-1]} s{c.seed}": why
                     for c, r in rs if (why := gates.run_collapse(r))}
        lost = {f"{c.method.split(' ', 2)[-1]} s{c.seed}": n
                for c, r in rs if (n := failed_rounds(r))}
        state = ("unstable" if collapsed or lost else
                 "undecided" if len(rs) < len(planned) else "stable")
        status[name] = state
        per_eps = {eps_name(e): [r["final_accuracy"] for c, r in rs
                                 if c.method.endswith(f"ε={eps_name(e)}")] for e in EPSILONS}
        rows.append({"recipe": name, "max_grad_norm": clip, "planned": len(planned),
                     "runs": len(rs), "accuracy": per_eps,
                     "mean": statistics.fmean([r["final_accuracy"] for _, r in rs]) if rs else None,
                     "collapsed_runs": collapsed, "lost_device_rounds": lost, "status": state})
    good = [r for r in rows if r["status"] == "stable"]
    decided = all(s != "undecided" for s in status.values())
    chosen = max(good, key=lambda r: r["mean"])["recipe"] if good and decided else None
    return {"rows": rows, "status": status, "chosen": chosen,
            "chosen_recipe": {"max_grad_norm": CANDIDATES[chosen]} if chosen else None,
            "not_run": [c.label for c in every if c not in done]}


def _acc(xs: list[float]) -> str:
    if not xs:
        return "—"
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{100 * statistics.fmean(xs):.2f} ± {100 * sd:.2f} (n={len(xs)})"


def markdown(result: dict) -> str:
    lines = sweep.opening(
        result, "# Felo's local gradient clip under local DP: a sweep on a validation split",
        __doc__,
        "**No candidate is stable**: the grid keeps its recipe.")
    lines += ["| recipe | runs | val. acc % at ε = 1 | at ε = ∞ | mean of all runs | collapsed "
              "runs | device-rounds lost | status |", "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        mean = "—" if r["mean"] is None else f"{100 * r['mean']:.2f}"
        collapsed = "; ".join(f"{k}: {', '.join(v)}" for k, v in r["collapsed_runs"].items())
        lost = ", ".join(f"{k}: {n}" for k, n in r["lost_device_rounds"].items())
        lines.append(f"| {r['recipe']} | {r['runs']} of {r['planned']} | "
                     f"{_acc(r['accuracy']['1'])} | {_acc(r['accuracy']['∞'])} | {mean} | "
                     f"{collapsed or 'none'} | {lost or 'none'} | {r['status']} |")
    if result["not_run"]:
        lines += ["", f"Not run ({len(result['not_run'])} cells): "
                  + ", ".join(f"`{x}`" for x in result["not_run"]) + "."]
    lines += sweep.provenance(result, f"{sweep.cell_minutes(result)} (one torch thread per cell, "
                              "2 workers).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    return sweep.main(
        argv, "Felo's local gradient clip under local DP: a validation sweep.", HERE,
        "felo_recipe", cells, summarize, markdown,
        command="nice -n 5 python -m benchmarks.privacy.felo_recipe --workers 2",
        keys=("method", "setting", "seed", "final_accuracy", "slope", "per_round",
              "client_accuracy", "client_class_counts", "client_predictions", "code",
              "code_hash", "config"))


if __name__ == "__main__":
    main()
