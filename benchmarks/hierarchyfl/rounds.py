"""HierarchyFL within the hour: how many rounds the grid runs, chosen on a validation split
(issue 37).

Measured before this check (session 30, 2026-11-28; AMD EPYC family 25 model 17, Zen 4 with
AVX-512, 2 cores: the faster of this project's machines): one Dir(0.1) cell of the declared
profile (stride-2 stem, 32 rounds) took 106 CPU s for HeteroFL and 128 for HierarchyFL, the two
run side by side at clean `1c21f8b` (the reviewer's check, ``--cells heterofl,hierarchyfl
--setting dir0.1 --seeds 0``, into a scratch folder). The grid's 72 cells (26 HeteroFL, 46 of
the HierarchyFL family) and its 7 bounds come to about 9,200 CPU s: about 77 minutes at two
workers, over the hour on this machine too (the Zen 3 of sessions 22–29 is about 2.4× slower).
A cell's cost is about proportional to its rounds.

The candidates keep everything but the rounds, the ×0.1 steps scaled by
:func:`benchmarks.common.decay_rounds` (40 % and 70 % of the rounds):

- **20 rounds** (×0.1 before rounds 9 and 15): about 0.63 of the cost, 48 minutes projected here;
- **16 rounds** (×0.1 before rounds 7 and 12): 0.5, 39 minutes.

24 rounds (about 58 minutes projected) is not a candidate: too close to the hour to meet it.

The rule, fixed in this docstring before any of these cells runs. On a validation split of
1,000 held-out training images (the test set is never read), seeds 10–14, each candidate runs
two settings:
- Local-IID (the bound's configuration: eight devices on IID shards);
- HierarchyFL at Dir(0.1) with the 600-image public set (the main setting of the paper's
  claims; at 20 rounds with the earlier schedule it was still climbing there).

A candidate **qualifies** when:
- no run collapses (:func:`benchmarks.gates.run_collapse`);
- Local-IID's mean final validation accuracy is at least 76 %;
- each setting's mean last-quarter slope is below 0.5 points per 10 % of rounds.

The candidate with the **most rounds** that qualifies is chosen: the profile changes as little as
the hour allows. If neither qualifies, the grid stays at 32 rounds and its page says the hour is
not met. The cells run most rounds first.

The chosen rounds are then declared (``declared.json``) before the grid's cells run, and the grid
and its bounds regenerate in one invocation at a clean commit
(``python -m benchmarks.hierarchyfl --workers 2 --only grid,bound``; the sweeps' cells are read).

Run it at a clean commit with ``python -m benchmarks.hierarchyfl.rounds --workers 2``
(``--report-only`` rewrites rounds.json/rounds.md from the cached cells in ``rounds_cells/``).
"""

from __future__ import annotations

from pathlib import Path

from benchmarks import sweep
from benchmarks.cells import Cell
from benchmarks.common import decay_rounds
from benchmarks.hierarchyfl import stem_check

HERE = Path(__file__).resolve().parent
COMMAND = "python -m benchmarks.hierarchyfl.rounds --workers 2"
SEEDS = (10, 11, 12, 13, 14)
#: most rounds first (the order the cells run in, and the order of preference)
CANDIDATES = {f"{n} rounds": {"rounds": n, "lr_decay_rounds": decay_rounds(n)} for n in (20, 16)}
VALIDATION = {"validation_samples": 1000}


def cells() -> list[Cell]:
    """Per candidate (most rounds first): Local-IID, then HierarchyFL at Dir(0.1), every seed."""
    from benchmarks.hierarchyfl import make

    bench = make(False)
    local = bench.bounds["local_iid"][0].config
    method = next(c.config for c in bench.cells
                  if c.method == "hierarchyfl" and c.setting == "dir0.1")
    return [Cell(name, setting, seed, {**config, **VALIDATION, **candidate}, role="sweep")
            for name, candidate in CANDIDATES.items()
            for setting, config in (("local iid", local), ("hierarchyfl dir0.1", method))
            for seed in SEEDS]


def summarize(records: list[dict | None], every: list[Cell]) -> dict:
    """stem_check's verdict per candidate; the chosen one by the rule above."""
    rows = {}
    for name in CANDIDATES:
        pairs = [(r, c) for r, c in zip(records, every, strict=True) if c.method == name]
        rows[name] = stem_check.summarize([r for r, _ in pairs], [c for _, c in pairs])
    # most rounds first: the first that does not fail, chosen once it passes
    first = next((n for n in CANDIDATES if rows[n]["status"] != "fails"), None)
    chosen = first if first and rows[first]["status"] == "passes" else None
    return {"rows": rows, "chosen": chosen,
            "chosen_recipe": CANDIDATES.get(chosen) if chosen else None}


def markdown(result: dict) -> str:
    chosen = (f"**Chosen: {result['chosen']}** ({result['chosen_recipe']})." if result["chosen"]
              else "**Not chosen** (cells to run, or no candidate qualifies).")
    lines = ["# HierarchyFL within the hour: the grid's rounds, chosen on a validation split", "",
             (__doc__ or "").split("\n\n", 1)[1].split("\n\nRun it")[0], "", chosen, "",
             "| candidate | setting | runs | final val. acc % per seed | mean % | "
             "last-quarter slope | verdict |", "|---|---|---|---|---|---|---|"]
    for name, row in result["rows"].items():
        verdict = row["status"] + (f" ({'; '.join(row['why'])})" if row["why"] else "")
        lines += [f"| {name} | {r['setting']} | {stem_check.row_cells(r)} | {verdict} |"
                  for r in row["rows"]]
    return "\n".join(lines + sweep.provenance(result, sweep.cell_minutes(result) + " in all."))


def main(argv: list[str] | None = None) -> dict:
    return sweep.main(argv, "HierarchyFL's rounds for the hour (issue 37).", HERE, "rounds",
                      cells, summarize, markdown, command=COMMAND,
                      keys=("method", "setting", "seed", "final_accuracy", "per_round", "slope",
                            "wall_seconds", "cpu_seconds", "code", "code_hash"))


if __name__ == "__main__":
    main()
