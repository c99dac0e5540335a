"""Why Felo and Velo end below FedAvg in homo-Dir(0.5) (issue 37: a claim that does not hold is
reported with its measured reason).

In the homogeneous setting (ResNet18 at width 0.125 on all ten devices, Dir(0.5)) every device
averages its weights with the others, as FedAvg's do, and Felo adds its distillation terms: with
weight ``alpha`` (0.5), each device pulls its features towards the server's per-class feature means
and its logits towards the server's per-class logits (after a 5 % warm-up of cross-entropy alone).
This diagnostic runs Felo with ``alpha=0`` on the benchmark's own homo-Dir(0.5) cells (the same
seeds 0–2, fleet, data and schedule; only the option differs) and splits Felo − FedAvg per seed:

    Felo − FedAvg = (Felo − Felo alpha=0)  +  (Felo alpha=0 − FedAvg)
                    the distillation terms    the rest of Felo's path (its averaging, its training
                                              loop, its BatchNorm statistics): 0 if it is FedAvg's

The rule, written before the cells run: a term is called the cause when its mean is beyond 2 sd
of its per-seed values and accounts for more than half of the gap. Nothing is tuned: no setting of
the benchmark changes with this result (it is a diagnostic, on the test split the benchmark's
cells already read). FedAvg's and Felo's cells are read from the benchmark's cache; only the three
``alpha=0`` cells run (into ``homo_alpha0_cells/``).

    nice -n 5 python -m benchmarks.felo_velo.investigations.homo_alpha0 --workers 2
"""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks import sweep
from benchmarks.cache import Cache
from benchmarks.cells import Cell
from benchmarks.felo_velo import make

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
SETTING = "homo-dir0.5"
NAME = "homo_alpha0"


def benchmark_cells() -> dict[str, list[Cell]]:
    """The benchmark's homo-Dir(0.5) cells by method (fedavg, felo), in seed order."""
    grid = [c for c in make(False).cells if c.setting == SETTING]
    return {m: sorted((c for c in grid if c.method == m), key=lambda c: c.seed)
            for m in ("fedavg", "felo")}


def ablation_cells() -> list[Cell]:
    """Felo's cells with the distillation weight at 0 (every other setting the benchmark's)."""
    return [Cell("felo alpha=0", SETTING, c.seed,
                 {**c.config, "options": {**dict(c.config.get("options") or {}), "alpha": "0"}},
                 role="diagnostic")
            for c in benchmark_cells()["felo"]]


def split(fedavg: list[float], felo: list[float], alpha0: list[float]) -> dict:
    """Felo − FedAvg per seed and its two terms, with mean, sd and the rule's verdict per term."""
    terms = {
        "felo − fedavg": [f - a for f, a in zip(felo, fedavg, strict=True)],
        "distillation terms (felo − felo alpha=0)": [f - z for f, z in zip(felo, alpha0,
                                                                           strict=True)],
        "rest of Felo's path (felo alpha=0 − fedavg)": [z - a for z, a in zip(alpha0, fedavg,
                                                                           strict=True)],
    }
    gap = statistics.mean(terms["felo − fedavg"])
    out = {}
    for name, values in terms.items():
        mean, sd = statistics.mean(values), statistics.stdev(values)
        share = mean / gap if gap else float("nan")
        out[name] = {"per_seed": values, "mean": mean, "sd": sd, "share_of_gap": share,
                     "cause": (name != "felo − fedavg" and abs(mean) > 2 * sd and share > 0.5)}
    return out


def summarize(records: list, every: list[Cell]) -> dict:
    cache = Cache(BENCH / "cells")
    base = {m: [cache.find(c) for c in cs] for m, cs in benchmark_cells().items()}
    ran = [r for r in records if r is not None]
    result = {"setting": SETTING, "seeds": [c.seed for c in every],
              "missing": [c.method + f":s{c.seed}" for c, r in zip(every, records, strict=True)
                          if r is None]}
    if result["missing"] or any(r is None for rs in base.values() for r in rs):
        return {**result, "chosen": None, "terms": {}}
    acc = {m: [100 * r["final_accuracy"] for r in rs] for m, rs in base.items()}
    acc["felo alpha=0"] = [100 * r["final_accuracy"] for r in ran]
    terms = split(acc["fedavg"], acc["felo"], acc["felo alpha=0"])
    causes = [n for n, t in terms.items() if t["cause"]]
    return {**result, "accuracy": acc, "terms": terms, "chosen": ", ".join(causes) or "neither"}


def markdown(result: dict) -> str:
    doc = __doc__.split("\n\n    nice")[0]
    lines = ["# Felo below FedAvg in homo-Dir(0.5): the distillation terms, or the rest?", "",
             doc.split("\n", 2)[2] if doc.count("\n") > 2 else doc, ""]
    if not result["terms"]:
        missing = ", ".join(result["missing"]) or "benchmark cells"
        lines += [f"**Not run yet** (missing: {missing})."]
    else:
        acc = result["accuracy"]
        lines += ["| method | " + " | ".join(f"seed {s}" for s in result["seeds"]) + " | mean |",
                  "|---|" + "---|" * (len(result["seeds"]) + 1)]
        for m, v in acc.items():
            lines.append(f"| {m} | " + " | ".join(f"{x:.2f}" for x in v)
                         + f" | {statistics.mean(v):.2f} |")
        lines += ["", "| term | per seed (points) | mean ± sd | share of the gap | the cause? |",
                  "|---|---|---|---|---|"]
        for name, t in result["terms"].items():
            per = ", ".join(f"{x:+.2f}" for x in t["per_seed"])
            cause = "—" if name == "felo − fedavg" else ("**yes**" if t["cause"] else "no")
            lines.append(f"| {name} | {per} | {t['mean']:+.2f} ± {t['sd']:.2f} | "
                         f"{100 * t['share_of_gap']:.0f} % | {cause} |")
        lines += ["", f"By the rule: **{result['chosen']}**."]
    lines += sweep.provenance(result, sweep.cell_minutes(result) if result.get("wall_seconds")
                              else "no cell run")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    return sweep.main(argv, "Felo below FedAvg in homo-Dir(0.5): an alpha=0 diagnostic.", HERE,
                      NAME, ablation_cells, summarize, markdown,
                      command="nice -n 5 python -m benchmarks.felo_velo.investigations.homo_alpha0"
                      " --workers 2",
                      keys=("method", "setting", "seed", "final_accuracy", "slope", "code",
                            "code_hash", "config"))


if __name__ == "__main__":
    main()
