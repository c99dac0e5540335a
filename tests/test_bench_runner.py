"""The shared benchmark runner: claims evaluated by code, the cell cache, parallel = serial."""

from __future__ import annotations

import pytest

from benchmarks import runner
from benchmarks.runner import Cache, Cell, Claim, evaluate_claim, last_quarter_slope, run_cells


def run(method, seed, acc, setting="s", slope=0.1, **extra):
    return {"method": method, "setting": setting, "seed": seed, "final_accuracy": acc, "slope": slope, "role": "grid", **extra}


def test_strict_claim_needs_the_mean_above_two_sd_and_every_seed_to_agree():
    # Prepare: A beats B by 2, 3, 4 points (mean 3, sd 1): a clear win
    runs = [run("a", s, 0.80 + d) for s, d in enumerate((0.02, 0.03, 0.04))] + [run("b", s, 0.80) for s in range(3)]
    # Execute
    c = evaluate_claim(Claim("x", "a > b", "s"), runs)
    # Assert
    assert c["holds"] and c["verdict"] == "holds"
    assert c["mean_diff"] == pytest.approx(0.03) and c["sd"] == pytest.approx(0.01)
    assert c["signs"] == [1, 1, 1] and c["seeds"] == [0, 1, 2]
    # one seed the other way round: a strict claim fails even if the mean is positive
    runs[2] = run("a", 2, 0.79)
    c = evaluate_claim(Claim("x", "a > b", "s"), runs)
    assert not c["holds"] and c["verdict"] == "does not hold" and c["signs"] == [1, 1, -1]


def test_weak_claim_holds_above_minus_one_sd_and_mirrors_for_less_than():
    # differences -1, +1, -0.5 points: mean -0.17, sd 1.04 -> "a >= b" holds, "a > b" does not
    runs = [run("a", s, 0.5 + d) for s, d in enumerate((-0.01, 0.01, -0.005))] + [run("b", s, 0.5) for s in range(3)]
    assert evaluate_claim(Claim("x", "a ≥ b", "s"), runs)["holds"]
    assert evaluate_claim(Claim("x", "a >= b", "s"), runs)["holds"]
    assert not evaluate_claim(Claim("x", "a > b", "s"), runs)["holds"]
    assert not evaluate_claim(Claim("x", "a < b", "s"), runs)["holds"]
    # a clear loss: "a ≥ b" fails, "a < b" holds
    runs = [run("a", s, 0.4 - 0.01 * s) for s in range(3)] + [run("b", s, 0.5) for s in range(3)]
    assert not evaluate_claim(Claim("x", "a ≥ b", "s"), runs)["holds"]
    assert evaluate_claim(Claim("x", "a < b", "s"), runs)["holds"]


def test_claims_are_read_only_on_converged_runs_with_three_seeds_and_on_the_named_metric():
    runs = [run("a", s, 0.9, per_tier={"1": 0.5}) for s in range(3)] + [run("b", s, 0.8, per_tier={"1": 0.6}) for s in range(3)]
    assert evaluate_claim(Claim("x", "a > b", "s"), runs)["holds"]
    assert evaluate_claim(Claim("x", "a < b", "s", metric="per_tier.1"), runs)["holds"]
    runs[0]["slope"] = 2.0  # still climbing
    c = evaluate_claim(Claim("x", "a > b", "s"), runs)
    assert not c["holds"] and c["verdict"] == "not converged" and c["statistic_holds"]
    two = [r for r in runs if r["seed"] < 2]
    for r in two:
        r["slope"] = 0.0
    c = evaluate_claim(Claim("x", "a > b", "s"), two)
    assert not c["holds"] and c["verdict"] == "too few seeds"
    assert evaluate_claim(Claim("x", "a > b", "other"), runs)["verdict"] == "no runs"
    # before vs after of one method: metric_a / metric_b
    same = [run("a", s, 0.9, before=0.7 + 0.01 * s) for s in range(3)]
    c = evaluate_claim(Claim("x", "a > a", "s", metric_a="final_accuracy", metric_b="before"), same)
    assert c["holds"] and c["mean_diff"] == pytest.approx(0.19)
    with pytest.raises(ValueError, match="cannot parse"):
        Claim("x", "a beats b", "s").parse()


def test_last_quarter_slope_is_points_per_tenth_of_the_run():
    # 40 rounds, +0.1 point per round over the last quarter -> 0.4 points per 4 rounds
    per_round = [{"round": r, "accuracy": 0.5 + 0.001 * r} for r in range(1, 41)]
    assert last_quarter_slope(per_round, 40) == pytest.approx(0.4)
    assert last_quarter_slope([{"round": 40, "accuracy": 0.5}], 40) is None


def tiny_cell(seed, method="fedavg", algorithm="fedavg"):
    config = {"algorithm": algorithm, "dataset": "synthetic", "clients": 2, "rounds": 2, "train_samples": 200,
              "test_samples": 100, "eval_samples": 50, "steps": 2, "batch_size": 16, "model": "cnn",
              "tiers": ("1",), "width": 0.25, "min_size": 5}
    return Cell(method, "synthetic", seed, config)


@pytest.mark.slow
def test_cells_are_cached_by_configuration_and_parallel_cells_equal_serial_ones(tmp_path, monkeypatch):
    # Prepare: two cells, run one worker at a time and two at a time into separate caches
    cells = [tiny_cell(0), tiny_cell(1, method="local", algorithm="local")]
    serial = run_cells(cells, Cache(tmp_path / "serial"), workers=1, log=lambda m: None)
    parallel = run_cells(cells, Cache(tmp_path / "parallel"), workers=2, log=lambda m: None)
    # Assert: identical numbers, whichever worker ran a cell
    for s, p in zip(serial, parallel, strict=True):
        assert s["key"] == p["key"]
        assert s["final_accuracy"] == p["final_accuracy"] and s["client_accuracy"] == p["client_accuracy"]
        assert s["per_round"] == p["per_round"]
    assert len(list((tmp_path / "serial").glob("*.json"))) == 2
    # Execute again: everything comes from the cache, nothing runs
    monkeypatch.setattr(runner, "run_cell", lambda *a, **k: pytest.fail("a cached cell ran again"))
    again = run_cells(cells, Cache(tmp_path / "serial"), workers=2, log=lambda m: None)
    assert [r["final_accuracy"] for r in again] == [r["final_accuracy"] for r in serial]
    # a relabelled cell with the same configuration reuses the record under its own label
    relabelled = Cell("renamed", "elsewhere", 0, cells[0].config, role="sweep")
    hit = Cache(tmp_path / "serial").get(relabelled)
    assert hit["method"] == "renamed" and hit["role"] == "sweep" and hit["final_accuracy"] == serial[0]["final_accuracy"]


def test_the_cache_key_covers_resolved_defaults_and_options():
    from edgefl.algorithms import get_algorithm

    default = get_algorithm("felo").parse_options({}).alpha
    a = tiny_cell(0, algorithm="felo", method="felo")
    explicit_default = Cell("felo", "synthetic", 0, {**a.config, "options": {"alpha": str(default)}})
    other = Cell("felo", "synthetic", 0, {**a.config, "options": {"alpha": str(default * 2)}})
    assert a.key == explicit_default.key  # the default spelled out is the same run
    assert a.key != other.key and a.key != tiny_cell(1, algorithm="felo", method="felo").key
