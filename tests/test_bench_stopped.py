"""The runner records a run that stops before its last round as a cell (issue 40's DP runs):
every device failing a round (a collapse, for the gates) or every device's privacy budget spent
(a legitimate end). Tiny synthetic runs, in this process."""

from __future__ import annotations

import pytest

from benchmarks import gates
from benchmarks.cells import ALL_FAILED, BUDGET_SPENT, Cell, run_cell, stopped_summary
from benchmarks.runner import Claim, evaluate_claim
from edgefl.errors import AllDevicesFailed
from edgefl.privacy.accountant import calibrate_noise
from tests.bench_cases import tiny_cell

TINY = {**tiny_cell(0).config, "rounds": 3}  # the runner tests' tiny cell, one round longer
#: central DP whose noise (std 1000 · 1e6 / 2 per weight) makes every device's next loss non-finite
DIVERGES = {"dp": "central", "dp_target_epsilon": "8", "dp_noise_multiplier": "1000",
            "dp_clip": "1e6"}


def spends_in_one_round() -> dict[str, str]:
    """Central DP whose budget (ε = 2) holds one round of its noise, not two."""
    z = calibrate_noise(2.0, 1e-5, 1) * 1.1
    return {"dp": "central", "dp_target_epsilon": "2", "dp_noise_multiplier": f"{z:.4f}",
            "dp_clip": "1"}


def cell(method: str, seed: int, options: dict) -> Cell:
    return Cell(method, "synthetic", seed, {**TINY, "options": options})


def test_a_run_where_every_device_fails_is_a_cell_and_counts_as_collapsed(tmp_path):
    # Execute: the noise blows the model up after round 1; the loop ends the run in round 2
    record = run_cell(cell("diverges", 0, DIVERGES), draft=True, tmp_root=str(tmp_path))
    # Assert: recorded, with what it had: round 1's evaluation, the round it stopped at and why
    assert record["stopped_at_round"] == 2 and record["stop_reason"] == ALL_FAILED
    assert record["stop_detail"].startswith("round 2: all 2 devices failed")
    assert [p["round"] for p in record["per_round"]] == [1]
    assert record["final_accuracy"] == record["per_round"][0]["accuracy"]
    assert record["accuracy_from_round"] == 1 and set(record["client_accuracy"]) == {"d00", "d01"}
    assert record["slope"] is None  # no evaluation in the last quarter of its 3 rounds
    # the gates list it as collapsed, whatever its accuracy; a claim over it is not comparable
    record["final_accuracy"] = 0.9  # as if it had stopped well above chance
    assert any("every device failed" in r for r in gates.run_collapse(record))
    others = [{**record, "seed": s} for s in (1, 2)]
    other_method = [{**r, "method": "b", "stop_reason": None, "stopped_at_round": None,
                     "final_accuracy": 0.5, "client_accuracy": {"d00": 0.5, "d01": 0.5},
                     "slope": 0.1}
                    for r in [record, *others]]
    runs = [record, *others, *other_method]
    collapsed = gates.evaluate({}, runs)["collapsed"]
    assert set(collapsed) == {f"diverges|synthetic|{s}" for s in (0, 1, 2)}
    c = evaluate_claim(Claim("c", "diverges > b", "synthetic"), runs, collapsed=collapsed)
    assert c["verdict"] == "not comparable" and "every device failed" in c["reason"]
    # the page's runs table marks it, and says what a stopped run's accuracy is
    from benchmarks.pages import runs_table

    table = "\n".join(runs_table(runs))
    assert "| diverges (3 stopped) | 3 |" in table and "| b | 3 |" in table
    assert "*stopped*: runs that ended before their last round" in table
    # and it has no last-quarter curve: named so, not as another method's slope
    assert (
        "no last-quarter slope for diverges (" in c["reason"] and "method slope" not in c["reason"]
    )


def test_a_run_whose_privacy_budget_is_spent_is_a_legitimate_end(tmp_path):
    # Execute: the budget holds round 1; from round 2 the server asks no device (all spent)
    record = run_cell(cell("spent", 0, spends_in_one_round()), draft=True, tmp_root=str(tmp_path))
    # Assert: the run ran to its end (final evaluation of the model the fleet has from round 1 on),
    # marked as stopped by the budget at round 2
    assert record["stopped_at_round"] == 2 and record["stop_reason"] == BUDGET_SPENT
    assert [p["round"] for p in record["per_round"]] == [1, 2, 3]
    assert record["final_accuracy"] is not None
    # the curve ends with the last round's per-round evaluation (not the final one's test split)
    last = record["per_round"][-1]
    assert last["accuracy"] is not None and "final" not in last
    # not a collapse (the gates read it as any run: chance and one-class devices only)
    assert not any("every device failed" in r for r in gates.run_collapse(record))


def test_every_device_failing_raises_its_failures_with_the_round_counted_from_one():
    e = AllDevicesFailed(3, {"d0": "FloatingPointError: nan", "d1": "PrivacyBudgetSpent: x"})
    assert str(e).startswith("round 4: all 2 devices failed (first: FloatingPointError: nan)")
    assert e.round == 3 and e.failed["d1"] == "PrivacyBudgetSpent: x"
    # every device refusing because its budget is spent: a budget stop, not a collapse
    refused = {"d0": "PrivacyBudgetSpent: privacy budget spent: ε = 8"}
    spent = stopped_summary(AllDevicesFailed(1, refused), [])
    assert spent["stop_reason"] == BUDGET_SPENT and spent["mean_accuracy"] is None
    assert spent["stopped_at_round"] == 2
    evaluated = {"mean_accuracy": 0.5, "tier_accuracy": {}, "client_accuracy": {}}
    mixed = stopped_summary(AllDevicesFailed(1, {"d0": "privacy budget spent", "d1": "nan"}),
                            [{"round": 1, "eval": evaluated}])
    assert mixed["stop_reason"] == ALL_FAILED and mixed["mean_accuracy"] == pytest.approx(0.5)


def test_missing_only_runs_just_the_cells_no_code_has_a_record_of(tmp_path, monkeypatch):
    # Prepare: two cells of a benchmark, one cached by other code (an earlier commit)
    from benchmarks import runner
    from benchmarks.cache import Cache

    cells = [cell("a", 0, {}), cell("a", 1, {})]
    Cache(tmp_path / "cells", code_hash="0ther0ther0ther0").put(cells[0], {"final_accuracy": 0.5})
    asked: list = []

    class Ran(Exception):
        pass

    def fake_run_cells(todo, cache, **kw):
        asked.extend(todo)
        raise Ran

    monkeypatch.setattr(runner, "run_cells", fake_run_cells)
    bench = runner.Benchmark("t", "T", "tiny", cells)
    # Execute
    with pytest.raises(Ran):
        runner.main(lambda quick: bench, ["--missing-only", "--draft", "--out", str(tmp_path)])
    # Assert: only the cell without any record runs
    assert asked == [cells[1]]


def test_settings_runs_just_the_cells_of_those_settings_and_reports_the_rest_from_any_code(
    tmp_path, monkeypatch
):
    # Prepare: cells of two settings, all cached by other code (before a declaration changed)
    from benchmarks import runner
    from benchmarks.cache import Cache

    cells = [runner.Cell("a", s, seed, {}) for s in ("x", "y") for seed in (0, 1)]
    for c in cells:
        Cache(tmp_path / "cells", code_hash="0ther0ther0ther0").put(c, {"final_accuracy": 0.5})
    asked: list = []

    def fake_run_cells(todo, cache, **kw):
        asked.extend(todo)
        raise SystemExit("ran")

    monkeypatch.setattr(runner, "run_cells", fake_run_cells)
    bench = runner.Benchmark("t", "T", "tiny", cells)
    # Execute: setting y regenerated
    with pytest.raises(SystemExit, match="ran"):
        runner.main(lambda quick: bench, ["--settings", "y", "--draft", "--out", str(tmp_path)])
    # Assert: only its cells run, whatever the cache holds for them
    assert asked == cells[2:]
    # a setting the benchmark does not have is named, with the ones it has
    with pytest.raises(SystemExit):
        runner.main(lambda quick: bench, ["--settings", "z", "--out", str(tmp_path)])
    assert asked == cells[2:]


def test_a_record_names_the_devices_whose_work_each_round_lost():
    from benchmarks.cells import make_record

    def round_(n: int, failed: dict) -> dict:
        return {"round": n, "completed": ["d01"], "failed": failed, "bytes_up_total": 1,
                "bytes_down_total": 1}

    rounds = [round_(1, {}), round_(2, {"d00": "FloatingPointError: non-finite 'logit'"})]
    summary = {"mean_accuracy": 0.5, "tier_accuracy": {}, "client_accuracy": {}}
    record = make_record(cell("m", 0, {}), {"rounds": 2}, summary, rounds, 1.0)
    assert [p.get("failed") for p in record["per_round"]] == [None, ["d00"]]
