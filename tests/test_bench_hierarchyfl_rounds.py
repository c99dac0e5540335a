"""The rule of benchmarks/hierarchyfl/rounds.py: the most rounds that keep the bounds and both
curves converged, checked on a validation split."""

from __future__ import annotations

from benchmarks.hierarchyfl import make, rounds
from tests.test_bench_felo_recipes import record


def run(outcome, ran=lambda c: True):
    every = rounds.cells()
    return [record(c, *outcome(c)) if ran(c) else None for c in every], every


def test_the_candidates_keep_the_profile_but_its_rounds_on_the_validation_split():
    every = rounds.cells()
    bench = make(False)
    method = next(c.config for c in bench.cells
                  if c.method == "hierarchyfl" and c.setting == "dir0.1")
    assert len(every) == 2 * 2 * len(rounds.SEEDS)
    assert [c.method for c in every[:10]] == ["20 rounds"] * 10  # most rounds first
    cell = next(c for c in every if c.method == "16 rounds" and c.setting == "hierarchyfl dir0.1")
    changed = {k for k in {**method, **cell.config} if method.get(k) != cell.config.get(k)}
    assert changed == {"rounds", "lr_decay_rounds", "validation_samples"}
    assert cell.config["rounds"] == 16 and tuple(cell.config["lr_decay_rounds"]) == (6, 11)


def test_the_most_rounds_that_qualify_are_chosen():
    got = rounds.summarize(*run(lambda c: (0.80, 0.1)))
    assert got["chosen"] == "20 rounds"
    # 20 rounds: HierarchyFL still climbing; 16 rounds passes
    got = rounds.summarize(*run(lambda c: (0.80, 0.7 if c.method == "20 rounds"
                                          and c.setting.startswith("hierarchyfl") else 0.1)))
    assert got["rows"]["20 rounds"]["status"] == "fails" and got["chosen"] == "16 rounds"
    # Local-IID under 76 % in both: nothing chosen, the grid stays at 32 rounds
    got = rounds.summarize(*run(lambda c: (0.70 if c.setting == "local iid" else 0.8, 0.1)))
    assert got["chosen"] is None


def test_nothing_is_chosen_while_the_preferred_candidate_has_cells_to_run():
    got = rounds.summarize(*run(lambda c: (0.80, 0.1), ran=lambda c: c.method == "16 rounds"))
    assert got["rows"]["20 rounds"]["status"] == "undecided" and got["chosen"] is None
