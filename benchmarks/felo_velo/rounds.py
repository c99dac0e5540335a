"""Felo/Velo within the hour: how many rounds the grid runs, chosen on a validation split.

Issue 37 asks each benchmark to regenerate in at most an hour on 2 cores. This benchmark's grid
and bounds (49 cells at 12 rounds) ran in one invocation at clean `a0524b5` in 71.0 minutes on
the project's present 2-core machine (AMD EPYC, Zen 3; Σ CPU 8,217 s, load 1.1–2.1): 18 % over.
Nothing but compute is left in a cell (session 28's profiles: device training 73–75 %, Velo's
CVAE 14–18 %, evaluation about 10 %; `benchmarks/scale/memory_format.md` for the one layout lever,
which changes every float and gained less than its noise end to end), and a cell's cost is
proportional to its rounds. Under the profile's schedule (×0.1 at 40 % and 70 % of the rounds,
:func:`benchmarks.common.decay_rounds`) the last four of the 12 rounds train at lr 1e-5, where
Adam moves a weight by about 1e-5 a step: a third of the cost for the flat end of the curve.

The candidates keep everything but the rounds, and the schedule scaled by the same rule:

- **9 rounds**: ×0.1 before rounds 5 and 7 (``decay_rounds(9)`` = (4, 6)); cost 0.75 of the
  12-round profile (about 53 minutes for the grid at the 12-round run's cost per round);
- **8 rounds**: ×0.1 before rounds 4 and 7 (``decay_rounds(8)`` = (3, 6)); cost 0.67 (about 47).

The rule is recipes.py's, fixed in this docstring before any of these cells runs: Local-IID (the
sanity gate's run) with one device per depth of 1,600 images (the profile's data per device), on a
validation split of 1,000 held-out training images (500 of them for the curve per round; the test
set is never read), seeds 10–14; a candidate **qualifies** when none of its runs collapses, its
mean final validation accuracy is at least 76 % and its mean last-quarter slope is below 0.5
points per 10 % of rounds; the cheapest qualifying candidate is chosen, once no cheaper candidate
still has seeds to run. The cells run cheapest first. If neither qualifies, the grid stays at 12
rounds and its page says the hour is not met on this machine. The profile at 12 rounds is the
reference (recipes.md's chosen "1600/dev": 76.86 ± 0.38 % over the same seeds at another commit);
it is not rerun here.

The chosen rounds are then declared (``declared.json``) before the grid's cells run, the whole
grid and its bounds regenerate in one invocation at a clean commit, and the page compares every
claim's sign with the 12-round cells (kept in ``previous12/``).

Run it at a clean commit with ``python -m benchmarks.felo_velo.rounds --workers 2``
(``--report-only`` rewrites rounds.json/rounds.md from the cached cells). Cells are cached in
``rounds_cells/``.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks import sweep
from benchmarks.cells import Cell
from benchmarks.common import decay_rounds
from benchmarks.felo_velo import recipes

HERE = Path(__file__).resolve().parent
COMMAND = "python -m benchmarks.felo_velo.rounds --workers 2"
#: the profile's Local-IID on the validation split (recipes.py's chosen "1600/dev")
BASE = {**recipes.CURRENT, **recipes.CANDIDATES["1600/dev"]}
#: cheapest first (the order that decides the rule soonest)
CANDIDATES = {f"{n} rounds": {"rounds": n, "lr_decay_rounds": decay_rounds(n)} for n in (8, 9)}
#: relative cost against the 12-round profile (rounds / 12), fixed before the runs
COST = {name: c["rounds"] / 12 for name, c in CANDIDATES.items()}
TAIL = "one torch thread per cell, two cells at a time, nothing else heavy on the machine."


def cells() -> list[Cell]:
    """Every seed of one candidate before the next, in :data:`CANDIDATES`' order."""
    return [Cell(name, "local-iid", seed, {**BASE, **candidate}, role="sweep")
            for name, candidate in CANDIDATES.items() for seed in recipes.SEEDS]


def summarize(records: list[dict | None], every: list[Cell]) -> dict:
    return recipes.summarize(records, every, CANDIDATES, COST, {})


def markdown(result: dict) -> str:
    return recipes.markdown(result, "Felo/Velo within the hour: the grid's rounds, chosen on a "
                            "validation split", __doc__, "", TAIL)


def main(argv: list[str] | None = None) -> dict:
    return sweep.main(argv, "Felo/Velo's rounds for the hour (issue 37).", HERE, "rounds",
                      cells, summarize, markdown, command=COMMAND, keys=recipes.RUN_KEYS,
                      wall=False)


if __name__ == "__main__":
    main()
