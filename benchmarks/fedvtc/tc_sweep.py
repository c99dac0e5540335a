"""FedVTC's tc_weight on the benchmark's fleet and recipe, chosen on a validation split over five
seeds for stability first, then accuracy (issue 37).

The grid ran tc_weight 0.001 with SGD lr 0.01, momentum 0.9 (the CNN family's recipe, chosen for
stability by ``benchmarks.foundation.recipes``), a value none of the earlier sweeps chose (they ran
at momentum 0 or other lrs, one seed each). At Dir(1) FedVTC ended 10.4 ± 5.3 points below Local,
7.2 of them the cost of L_tc's gradient on the model f_k (FedVTC − fedvtc-tc0 before the fine-tune,
``ten_devices/results.md``). This sweep runs FedVTC at the current tc_weight and at a tenth of it on
the grid's fleet and recipe (``benchmarks.fedvtc.profile``), with 1,000 of 4,000 training images
held out as the validation split (the test set is never read; 600 images per device remain, as in
the grid), in Dir(0.1) (where runs collapsed) and Dir(1) (where FedVTC fell below Local), over five
seeds the grid does not use. Local runs beside it on the same splits: the reference the gap is
measured against, and a check of the recipe's stability without FedVTC.

The rule, fixed before the runs: a candidate is *unstable* when one of its runs collapses (the
runner's gate, :func:`benchmarks.gates.run_collapse`: accuracy within 5 points of chance, or a
device predicting one class on the validation split while it holds two or more); among the others
the chosen one has the highest mean final validation accuracy (after the fine-tune) at Dir(1), the
setting where FedVTC fell below Local, once its five Dir(1) seeds have run. The Dir(0.1) runs come
after (the cells run in that order): a stability check of both candidates where runs collapsed
before; a collapse there makes the candidate unstable. With no candidate left stable, the one
with the fewest unstable runs, then the highest Dir(1) mean, and the page says so. (Larger
weights are not swept: 0.01 already diverged at SGD lr 0.1; and two cores shared by seven
engineers, at a load of 20–26, left time for two candidates and may leave the Dir(0.1) check
unfinished: the page lists what did not run.)

Run it at a clean commit with ``nice -n 5 python -m benchmarks.fedvtc.tc_sweep --workers 2``
(``--report-only`` rewrites tc_sweep.json/tc_sweep.md from the cached cells; ``--draft`` runs from
uncommitted code, marked). Cells are cached in ``tc_sweep_cells/``.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks import gates, sweep
from benchmarks.cells import Cell
from benchmarks.common import decay_rounds
from benchmarks.fedvtc import SETTINGS, grid_options, local_config, profile, synthetic

HERE = Path(__file__).resolve().parent
#: the command the results record
COMMAND = "nice -n 5 python -m benchmarks.fedvtc.tc_sweep --workers 2"
#: what the results keep of each run
RUN_KEYS = ("method", "setting", "seed", "final_accuracy", "per_round", "client_accuracy", "code",
            "code_hash", "config")
SEEDS = (10, 11, 12, 13, 14)  # not the grid's seeds (0–4)
CURRENT = "0.001"  # the method's default tc_weight, which the grid ran
CANDIDATES = ("0.001", "0.0001")
VALIDATION = {"validation_samples": 1000, "train_samples": 4000, "eval_samples": 1000}


def cells(quick: bool = False) -> list[Cell]:
    """FedVTC at every candidate and Local, per setting and seed: Dir(1) first (it decides), then
    Dir(0.1) (the stability check)."""
    base = {**profile(quick), **VALIDATION}
    if quick:
        base.update(validation_samples=300, train_samples=1800, eval_samples=300)
    seeds = SEEDS[:1] if quick else SEEDS
    out = []
    for setting in ("dir1", "dir0.1"):
        for seed in seeds:
            for w in CANDIDATES:
                cfg = {**base, **SETTINGS[setting], "algorithm": "fedvtc",
                       "options": {**grid_options(quick), "tc_weight": w}}
                out.append(Cell(f"tc_weight={w}", setting, seed,
                                {**cfg, "lr_decay_rounds": decay_rounds(cfg["rounds"])}, "sweep"))
            cfg = {**base, **SETTINGS[setting], **local_config(base, quick)}
            out.append(Cell("local", setting, seed,
                            {**cfg, "lr_decay_rounds": decay_rounds(cfg["rounds"])}, "sweep"))
    return out


def before_finetune(record: dict) -> float | None:
    """FedVTC: the evaluation after round R (before the fine-tune); Local: after as many epochs as
    a FedVTC device's real-data ones (its last 𝒯 epochs stand for the fine-tune)."""
    rounds = record["config"]["rounds"]
    if record["method"] == "local":
        rounds -= synthetic(record["config"]["train_samples"] < 4000)[1]
    return next((p.get("accuracy") for p in record["per_round"] if p["round"] == rounds), None)


def summarize(records: list[dict | None], every: list[Cell]) -> dict:
    """Per method and setting: final validation accuracy, before the fine-tune (FedVTC), the
    paired difference to Local, unstable runs; each candidate's status and the chosen one."""
    done = [r for r in records if r is not None]
    local = {(r["setting"], r["seed"]): r for r in done if r["method"] == "local"}
    rows, status, score, bad_runs = [], {}, {}, {}
    for name in [f"tc_weight={w}" for w in CANDIDATES] + ["local"]:
        means, bad, complete = [], 0, True
        for setting in SETTINGS:
            planned = [c for c in every if c.method == name and c.setting == setting]
            rs = sorted((r for r in done if r["method"] == name and r["setting"] == setting),
                        key=lambda r: r["seed"])
            complete = complete and len(rs) == len(planned)
            why = {r["seed"]: w for r in rs if (w := gates.run_collapse(r))}
            bad += len(why)
            finals = [r["final_accuracy"] for r in rs]
            means.append(statistics.fmean(finals) if finals else None)
            diffs = [r["final_accuracy"] - local[(setting, r["seed"])]["final_accuracy"]
                     for r in rs if (setting, r["seed"]) in local and name != "local"]
            before = [b for r in rs if (b := before_finetune(r)) is not None]
            rows.append({
                "method": name, "setting": setting, "planned": len(planned),
                "seeds": [r["seed"] for r in rs], "final": finals,
                "before": before,
                "minus_local": diffs, "unstable": why,
                "devices": [r.get("client_accuracy", {}) for r in rs],
            })
        if name != "local":
            status[name] = "unstable" if bad else "stable" if complete else "undecided"
            score[name] = statistics.fmean(means) if None not in means else None
            bad_runs[name] = bad
    names = list(status)
    dir1 = {n: [r["final_accuracy"] for r in done if r["method"] == n and r["setting"] == "dir1"]
            for n in names}
    planned = {n: sum(c.method == n and c.setting == "dir1" for c in every) for n in names}
    ready = [n for n in names if status[n] != "unstable" and len(dir1[n]) == planned[n]]
    chosen = None
    if ready and all(len(dir1[n]) == planned[n] or status[n] == "unstable" for n in names):
        chosen = max(ready, key=lambda n: statistics.fmean(dir1[n]))
    elif not ready and all(len(dir1[n]) == planned[n] for n in names):  # none stable
        chosen = max(names, key=lambda n: (-bad_runs[n], statistics.fmean(dir1[n])))
    return {"rows": rows, "status": status, "score": score, "unstable_runs": bad_runs,
            "chosen": chosen, "not_run": [c.label for c, r in zip(every, records, strict=True)
                                          if r is None]}


def _ms(xs: list[float], scale: float = 100) -> str:
    if not xs:
        return "—"
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{scale * statistics.fmean(xs):+.2f} ± {scale * sd:.2f}".lstrip("+")


def markdown(result: dict) -> str:
    chosen = (f"**Chosen: {result['chosen']}** (on its five Dir(1) seeds; the Dir(0.1) check: "
              + ("complete" if not any("dir0.1" in x for x in result["not_run"])
                 else "unfinished, the cells not run are listed below") + ")."
              if result["chosen"] else "**Not decided yet** (Dir(1) cells left to run).")
    if result["chosen"] and all(v == "unstable" for v in result["status"].values()):
        chosen += " No candidate is stable: chosen by the fewest unstable runs, then Dir(1)."
    lines = ["# FedVTC's tc_weight: a stability sweep on a validation split", "",
             (__doc__ or "").split("\n\n", 1)[1].split("\n\nRun it")[0], "", chosen, "",
             "| method | setting | runs | final val. acc % | before the fine-tune (Local: after "
             "the same real-data epochs) % | "
             "− Local (paired, points) | unstable runs |", "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        why = "; ".join(f"seed {s}: {', '.join(w)}" for s, w in r["unstable"].items()) or "none"
        diff = r["minus_local"]
        signs = " (" + " ".join("+" if d > 0 else "−" for d in diff) + ")" if diff else ""
        lines.append(f"| {r['method']} | {r['setting']} | {len(r['seeds'])} of {r['planned']} | "
                     f"{_ms(r['final'])} | {_ms(r['before'])} | {_ms(diff)}{signs} | {why} |")
    lines += ["", "| candidate | status (every run so far) | unstable runs | mean over the two "
              "settings % |", "|---|---|---|---|"]
    lines += [f"| {n} | {result['status'][n]} | {result['unstable_runs'][n]} | "
              + ("—" if result["score"][n] is None else f"{100 * result['score'][n]:.2f}") + " |"
              for n in result["status"]]
    lines += ["", "Per device (final validation accuracy %, devices in tier order), per run:", ""]
    for r in result["rows"]:
        for seed, acc in zip(r["seeds"], r["devices"], strict=True):
            lines.append(f"- {r['method']}, {r['setting']}, seed {seed}: "
                         + " ".join(f"{100 * acc[d]:.1f}" for d in sorted(acc)))
    if result["not_run"]:
        lines += ["", "Not run: " + ", ".join(f"`{x}`" for x in result["not_run"]) + "."]
    lines += sweep.provenance(result, f"{sweep.cell_minutes(result)} in all (one torch thread "
                              "per cell, two at a time on a shared machine).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    return sweep.main(argv, "FedVTC's tc_weight: a stability sweep (issue 37).", HERE, "tc_sweep",
                      cells, summarize, markdown, command=COMMAND, keys=RUN_KEYS,
                      quick="one seed, small, into runs/")


if __name__ == "__main__":
    main()
