"""The shared benchmark runner: claims evaluated by code, the cell cache, parallel = serial."""

from __future__ import annotations

import json

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


def test_convergence_is_read_on_each_methods_mean_slope_over_seeds():
    # one noisy run above the limit, its method's mean curve flat: readable
    runs = [run("a", s, 0.9, slope=x) for s, x in enumerate((0.8, -0.6, 0.1))] + [run("b", s, 0.8, slope=0.1) for s in range(3)]
    c = evaluate_claim(Claim("x", "a > b", "s"), runs)
    assert c["converged"] and c["holds"]
    assert c["method_slope"] == pytest.approx(0.1) and c["max_abs_slope"] == pytest.approx(0.8)
    # every seed still climbing: not readable, whatever the other method does
    for r in runs[:3]:
        r["slope"] = 0.6
    c = evaluate_claim(Claim("x", "a > b", "s"), runs)
    assert not c["converged"] and c["verdict"] == "not converged" and c["method_slope"] == pytest.approx(0.6)


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
    # two cells that spell one configuration differently run once and share the record
    monkeypatch.undo()
    spelled = Cell("spelled-out", "synthetic", 0, {**cells[0].config, "options": {}})
    assert spelled.key == cells[0].key and spelled != cells[0]
    logs: list[str] = []
    both = run_cells([cells[0], spelled], Cache(tmp_path / "dedup"), workers=2, log=logs.append)
    assert "1 to run" in logs[0] and len(list((tmp_path / "dedup").glob("*.json"))) == 1
    assert both[0]["final_accuracy"] == both[1]["final_accuracy"] and both[1]["method"] == "spelled-out"


def test_the_cache_key_covers_resolved_defaults_and_options():
    from edgefl.algorithms import get_algorithm

    default = get_algorithm("felo").parse_options({}).alpha
    a = tiny_cell(0, algorithm="felo", method="felo")
    explicit_default = Cell("felo", "synthetic", 0, {**a.config, "options": {"alpha": str(default)}})
    other = Cell("felo", "synthetic", 0, {**a.config, "options": {"alpha": str(default * 2)}})
    assert a.key == explicit_default.key  # the default spelled out is the same run
    assert a.key != other.key and a.key != tiny_cell(1, algorithm="felo", method="felo").key


def full_run(cell, acc, **extra):
    """A record as run_cell makes it, by hand (for report tests that run nothing)."""
    return {"method": cell.method, "setting": cell.setting, "seed": cell.seed, "role": cell.role, "key": cell.key,
            "final_accuracy": acc, "per_tier": {"1": acc}, "client_accuracy": {}, "slope": 0.1,
            "per_round": [{"round": 1, "accuracy": acc / 2}, {"round": 2, "accuracy": acc}],
            "bytes_up_per_device_round": 10.0, "bytes_down_per_device_round": 20.0, "wall_seconds": 1.0,
            "config": cell.full_config(), **extra}


def test_a_missing_metric_is_reported_as_missing_not_raised():
    # Prepare: runs without the metric the claim names (e.g. one the toolkit does not produce yet)
    runs = [run("a", s, 0.9) for s in range(3)] + [run("b", s, 0.8, oracle=None) for s in range(3)]
    # Execute
    c = evaluate_claim(Claim("x", "a > b", "s", metric="oracle"), runs)
    before_after = evaluate_claim(Claim("y", "a > a", "s", metric_a="final_accuracy", metric_b="before"), runs)
    # Assert
    assert c["verdict"] == "metric missing" and not c["holds"] and c["mean_diff"] is None
    assert "oracle" in c["missing"]
    assert before_after["verdict"] == "metric missing" and "before" in before_after["missing"]


def test_a_sweep_or_claim_on_a_missing_metric_still_writes_the_report(tmp_path):
    # Prepare: a benchmark whose sweep and one claim name a metric no run has
    cells = [tiny_cell(s, method=m, algorithm=m) for s in range(3) for m in ("fedavg", "local")]
    sweep_cells = {v: [Cell("fedavg", "val", 0, {**cells[0].config, "lr": v}, role="sweep")] for v in (0.01, 0.1)}
    bench = runner.Benchmark("t", "T", "tiny", cells, sweeps=[runner.Sweep("lr", (0.01, 0.1), sweep_cells, metric="oracle"),
                                                               runner.Sweep("lr", (0.01, 0.1), sweep_cells)],
                             claims=[Claim("ok", "fedavg > local", "synthetic"),
                                     Claim("later", "fedavg > local", "synthetic", metric="oracle")])
    records = {c: full_run(c, 0.8 + 0.01 * c.seed if c.method == "fedavg" else 0.5) for c in cells}
    records.update({c: full_run(c, 0.6 if v == 0.1 else 0.7) for v, cs in sweep_cells.items() for c in cs})
    # Execute
    results = runner.build_results(bench, records, {}, {}, "cmd")
    page = runner.results_markdown(bench, results)
    # Assert
    verdicts = {c["id"]: c["verdict"] for c in results["claims"]}
    assert verdicts == {"ok": "holds", "later": "metric missing"}
    missing, by_accuracy = results["sweeps"]
    assert missing["chosen"] is None and "oracle" in missing["missing"]
    assert by_accuracy["chosen"] == 0.01 and by_accuracy["validation_accuracy"] == pytest.approx([0.7, 0.6])
    assert "metric missing" in page and "chosen **0.01**" in page


def test_paired_differences_let_a_claim_compare_gains_across_settings_and_tiers():
    # Prepare: A − B is 5 points in "hard", 1 point in "easy"; per tier 8 / 2 points in "hard"
    runs = []
    for s in range(3):
        runs += [run("a", s, 0.70, setting="hard", slope=0.2, per_tier={"1": 0.70, "2": 0.72}),
                 run("b", s, 0.65, setting="hard", slope=-0.3, per_tier={"1": 0.62, "2": 0.70}),
                 run("a", s, 0.81 + 0.001 * s, setting="easy", per_tier={"1": 0.8}),
                 run("b", s, 0.80, setting="easy", per_tier={"1": 0.8})]
    # Execute
    derived = [d for st in ("hard", "easy") for d in runner.paired_difference(runs, "a", "b", st, method=st, as_setting="gain")]
    # Assert: one derived run per seed and setting, every metric differenced, the larger slope kept
    assert len(derived) == 6
    hard = [d for d in derived if d["method"] == "hard"]
    assert hard[0]["final_accuracy"] == pytest.approx(0.05) and hard[0]["per_tier"] == pytest.approx({"1": 0.08, "2": 0.02})
    assert hard[0]["slope"] == -0.3 and hard[0]["derived_from"] == ["a", "b", "hard"]
    assert evaluate_claim(Claim("x", "hard > easy", "gain"), derived)["holds"]
    tiers = evaluate_claim(Claim("t", "hard > hard", "gain", metric_a="per_tier.1", metric_b="per_tier.2"), derived)
    assert tiers["holds"] and tiers["mean_diff"] == pytest.approx(0.06)


def test_the_fedhenn_local_split_metric_weights_per_class_accuracy_by_the_device_labels():
    import torch

    from benchmarks.fedhenn import local_split_accuracy
    from edgefl.data import ArrayDataset
    from edgefl.data.datasets import DatasetInfo

    # Prepare: a "model" that always answers class 0, on a test set with classes 0 and 1 (3 images each)
    class Zero(torch.nn.Module):
        def forward(self, x):
            return torch.tensor([[1.0, 0.0]]).repeat(len(x), 1)

    info = DatasetInfo(name="t", num_classes=2, in_shape=(1, 2, 2), mean=(0.0,), std=(1.0,), class_names=("a", "b"))
    data = ArrayDataset(torch.zeros(6, 1, 2, 2, dtype=torch.uint8), torch.tensor([0, 0, 0, 1, 1, 1]), info)
    # Assert: a device holding only class 0 sees 100 %, a balanced one 50 %, a class-1 one 0 %
    assert local_split_accuracy(Zero(), data, [5, 0]) == pytest.approx(1.0)
    assert local_split_accuracy(Zero(), data, [3, 3]) == pytest.approx(0.5)
    assert local_split_accuracy(Zero(), data, [0, 7]) == pytest.approx(0.0)


@pytest.mark.slow
def test_record_extras_are_merged_into_the_record_and_cached_under_their_hook(tmp_path, monkeypatch):
    seen = {}

    def hook(out):
        seen["run_dir_exists"] = (out.run_dir / "rounds.jsonl").exists()
        seen["rounds"] = len(out.rounds)
        return {"rounds_seen": len(out.rounds), "first_round_accuracy": out.rounds[0]["eval"]["mean_accuracy"]}

    monkeypatch.setattr(runner, "load_hook", lambda spec: hook)
    cell = tiny_cell(0)
    # Execute
    record = runner.run_cell(cell, (), "tests:hook")
    # Assert: the hook saw the live run directory and its rounds; its keys are in the record
    assert seen == {"run_dir_exists": True, "rounds": 2} and record["rounds_seen"] == 2
    assert record["first_round_accuracy"] == record["per_round"][0]["accuracy"]
    assert record["extras_from"] == "tests:hook"
    # a record made with the hook is a hit for the hook, a miss for a benchmark without it (and back)
    Cache(tmp_path, "tests:hook").put(cell, record)
    assert Cache(tmp_path, "tests:hook").get(cell)["rounds_seen"] == 2
    assert Cache(tmp_path).get(cell) is None
    # a hook may not overwrite what the runner measured
    monkeypatch.setattr(runner, "load_hook", lambda spec: lambda out: {"final_accuracy": 1.0})
    with pytest.raises(ValueError, match="already has"):
        runner.run_cell(cell, (), "tests:clash")


def test_prepare_runs_once_before_cells_that_still_have_to_run(tmp_path):
    calls = []
    cells = [tiny_cell(0)]

    def make(quick):
        return runner.Benchmark("t", "T", "tiny", cells, prepare=lambda: calls.append(len(list((tmp_path / "cells").glob("*.json")))))

    runner.main(make, ["--out", str(tmp_path), "--workers", "1"])
    assert calls == [0]  # before the first cell ran
    runner.main(make, ["--out", str(tmp_path), "--workers", "1"])
    ran = json.loads((tmp_path / "results.json").read_text())
    ran["machine"]["before"]["date"], ran["code"] = "the day the cells ran", "abc1234"
    (tmp_path / "results.json").write_text(json.dumps(ran))
    runner.main(make, ["--out", str(tmp_path), "--report-only"])
    assert calls == [0]  # everything cached: nothing to prepare
    reported = json.loads((tmp_path / "results.json").read_text())
    # a report rewritten from the cache keeps the machine and code of the run that made the cells
    assert reported["machine"] == ran["machine"] and reported["code"] == ran["code"]


def test_a_sweep_keeps_the_default_when_the_best_value_is_within_the_noise():
    base = tiny_cell(0).config
    cells = {v: [Cell("m", "val", s, {**base, "lr": v}, role="sweep") for s in (0, 1)] for v in (0.01, 0.1, 1.0)}
    acc = {0.01: (0.700, 0.720), 0.1: (0.705, 0.725), 1.0: (0.50, 0.52)}
    records = {c: {"final_accuracy": acc[v][c.seed]} for v, cs in cells.items() for c in cs}
    close = runner.evaluate_sweep(runner.Sweep("lr", (0.01, 0.1, 1.0), cells, default=0.01), records)
    assert close["best"] == 0.1 and close["chosen"] == 0.01 and close["kept_default"]
    acc[0.1] = (0.80, 0.82)  # beats the default by far more than its sd
    records = {c: {"final_accuracy": acc[v][c.seed]} for v, cs in cells.items() for c in cs}
    far = runner.evaluate_sweep(runner.Sweep("lr", (0.01, 0.1, 1.0), cells, default=0.01), records)
    assert far["chosen"] == 0.1 and not far["kept_default"]
    assert runner.evaluate_sweep(runner.Sweep("lr", (0.01, 0.1, 1.0), cells), records)["chosen"] == 0.1
    with pytest.raises(ValueError, match="not in the grid"):
        runner.Sweep("lr", (0.01, 0.1, 1.0), cells, default=0.5)


@pytest.mark.slow
def test_fedvtc_records_a_sample_grid_from_the_final_generator_and_draws_it(tmp_path):
    from benchmarks import fedvtc

    # Prepare: a tiny FedVTC grid cell (seed 0: the one whose samples the page shows)
    config = {**tiny_cell(0).config, "algorithm": "fedvtc", "tiers": ("1", "2"),
              "feature_dim": 980, "options": {"synthetic_samples": "20", "finetune_epochs": "1"}}
    cell = Cell("fedvtc", "synthetic", 0, config)
    # Execute
    record = runner.run_cell(cell, (), "benchmarks.fedvtc:extras")
    page = fedvtc.figures({"runs": [record]}, tmp_path)
    # Assert: every class the prototypes know, SAMPLES_PER_CLASS images each, drawn into one figure
    samples = record["samples"]
    assert samples["shape"][:2] == [len(samples["classes"]), fedvtc.SAMPLES_PER_CLASS] and samples["classes"]
    assert samples["shape"][2:] == [28, 28]
    assert (tmp_path / "samples_synthetic.png").stat().st_size > 1000
    assert "samples_synthetic.png" in page


@pytest.mark.slow
def test_fedhenn_records_the_local_split_accuracy_of_every_device(tmp_path):
    # Prepare: a tiny FedHeNN cell on shards of 2 classes, its record made with the benchmark's hook
    config = {**tiny_cell(0).config, "algorithm": "fedhenn", "clients": 3, "partition": "shards",
              "classes_per_client": 2, "public_fraction": 0.1, "options": {"rad_size": "20"}}
    # Execute
    record = runner.run_cell(Cell("fedhenn", "synthetic", 0, config), (), "benchmarks.fedhenn:extras")
    # Assert: one local accuracy per device, their mean recorded, each a share
    local = record["client_local_accuracy"]
    assert set(local) == set(record["client_accuracy"]) and len(local) == 3
    assert all(0.0 <= a <= 1.0 for a in local.values())
    assert record["local_accuracy"] == pytest.approx(sum(local.values()) / 3)


def test_a_metric_can_be_the_difference_of_two():
    record = {"method": "m", "setting": "s", "seed": 0, "final_accuracy": 0.7, "accuracy_before_finetune": 0.65}
    assert runner.metric_value(record, "final_accuracy - accuracy_before_finetune") == pytest.approx(0.05)
    with pytest.raises(runner.MetricMissing, match="nothing"):
        runner.metric_value(record, "final_accuracy - nothing")


def test_an_option_added_later_keys_a_cell_only_when_it_changes_the_computation():
    # Prepare: a FedVTC cell at the defaults, one with the later option set, and the key the cell
    # had before the option existed (its resolved options without it)
    config = {"algorithm": "fedvtc", "dataset": "synthetic", "rounds": 1}
    paper = {"proto_rc_weight": "0", "psi_bn": "average"}  # the computation from before the options existed
    plain = Cell("fedvtc", "s", 0, {**config, "options": paper})
    proto = Cell("fedvtc", "s", 0, {**config, "options": {**paper, "proto_rc_weight": "10"}})
    keyed_without = runner.resolved_run(plain)["options"]
    # Assert: at the value that reproduces the old computation the option is not in the key; another value is
    assert "proto_rc_weight" not in keyed_without and "psi_bn" not in keyed_without
    assert runner.resolved_run(proto)["options"]["proto_rc_weight"] == 10.0
    assert plain.key != proto.key
    # a later default that differs from the old computation is keyed (every cell re-runs)
    # the method's default (10) is not the old computation: a cell that does not set it is keyed with it
    default = Cell("fedvtc", "s", 0, config)
    assert runner.resolved_run(default)["options"]["proto_rc_weight"] == 10.0 and default.key != plain.key
