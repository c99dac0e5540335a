"""The shared benchmark runner: claims evaluated by code, the cell cache, parallel = serial."""

from __future__ import annotations

import json

import pytest

from benchmarks import cache as cache_module
from benchmarks import cells as cells_module
from benchmarks import runner
from benchmarks.runner import Cache, Cell, Claim, evaluate_claim, last_quarter_slope, run_cells


def run(method, seed, acc, setting="s", slope=0.1, **extra):
    return {
        "method": method,
        "setting": setting,
        "seed": seed,
        "final_accuracy": acc,
        "slope": slope,
        "role": "grid",
        **extra,
    }


def test_strict_claim_needs_the_mean_above_two_sd_and_every_seed_to_agree():
    # Prepare: A beats B by 2, 3, 4 points (mean 3, sd 1): a clear win
    runs = [run("a", s, 0.80 + d) for s, d in enumerate((0.02, 0.03, 0.04))] + [
        run("b", s, 0.80) for s in range(3)
    ]
    # Execute
    c = evaluate_claim(Claim("x", "a > b", "s"), runs)
    # Assert
    assert c["holds"] and c["verdict"] == "reproduced"
    assert c["mean_diff"] == pytest.approx(0.03) and c["sd"] == pytest.approx(0.01)
    assert c["signs"] == [1, 1, 1] and c["seeds"] == [0, 1, 2]
    # one seed the other way round: a strict claim fails even if the mean is positive
    runs[2] = run("a", 2, 0.79)
    c = evaluate_claim(Claim("x", "a > b", "s"), runs)
    assert not c["holds"] and c["verdict"] == "not reproduced" and c["signs"] == [1, 1, -1]
    assert "2 of 3 seeds the claimed way" in c["reason"]  # the measured diagnostic beside it
    # significantly the other way: reversed
    runs = [run("a", s, 0.80 - d) for s, d in enumerate((0.02, 0.03, 0.04))] + [
        run("b", s, 0.80) for s in range(3)
    ]
    c = evaluate_claim(Claim("x", "a > b", "s"), runs)
    assert c["verdict"] == "reversed" and not c["holds"]


def test_a_not_worse_row_reads_above_minus_one_sd_and_never_as_a_claim_of_improvement():
    # differences -1, +1, -0.5 points: mean -0.17, sd 1.04 -> "a >= b" is not worse, "a > b" not
    # reproduced
    runs = [run("a", s, 0.5 + d) for s, d in enumerate((-0.01, 0.01, -0.005))] + [
        run("b", s, 0.5) for s in range(3)
    ]
    assert (
        evaluate_claim(Claim("x", "a ≥ b", "s", kind="not worse"), runs)["verdict"] == "not worse"
    )
    assert evaluate_claim(Claim("x", "a >= b", "s", kind="not worse"), runs)["holds"]
    assert evaluate_claim(Claim("x", "a > b", "s"), runs)["verdict"] == "not reproduced"
    assert evaluate_claim(Claim("x", "a < b", "s"), runs)["verdict"] == "not reproduced"
    # a clear loss: "a ≥ b" is worse, "a < b" reproduced
    runs = [run("a", s, 0.4 - 0.01 * s) for s in range(3)] + [run("b", s, 0.5) for s in range(3)]
    assert evaluate_claim(Claim("x", "a ≥ b", "s", kind="not worse"), runs)["verdict"] == "worse"
    assert evaluate_claim(Claim("x", "a < b", "s"), runs)["verdict"] == "reproduced"
    # a claim of improvement is strict; a non-inferiority row is weak: the kinds cannot be mixed up
    with pytest.raises(ValueError, match="strict"):
        Claim("x", "a ≥ b", "s")
    with pytest.raises(ValueError, match="not worse"):
        Claim("x", "a > b", "s", kind="not worse")
    with pytest.raises(ValueError, match="kind"):
        Claim("x", "a > b", "s", kind="headline")


def test_claims_are_read_only_on_converged_runs_with_three_seeds_and_on_the_named_metric():
    runs = [run("a", s, 0.9, per_tier={"1": 0.5}) for s in range(3)] + [
        run("b", s, 0.8, per_tier={"1": 0.6}) for s in range(3)
    ]
    assert evaluate_claim(Claim("x", "a > b", "s"), runs)["holds"]
    assert evaluate_claim(Claim("x", "a < b", "s", metric="per_tier.1"), runs)["holds"]
    runs[0]["slope"] = 2.0  # still climbing
    c = evaluate_claim(Claim("x", "a > b", "s"), runs)
    assert not c["holds"] and c["verdict"] == "not comparable" and c["statistic"] == "reproduced"
    assert "not converged" in c["reason"] and "the numbers alone: reproduced" in c["reason"]
    two = [r for r in runs if r["seed"] < 2]
    for r in two:
        r["slope"] = 0.0
    c = evaluate_claim(Claim("x", "a > b", "s"), two)
    assert not c["holds"] and c["verdict"] == "not comparable" and "2 seed(s)" in c["reason"]
    none = evaluate_claim(Claim("x", "a > b", "other"), runs)
    assert none["verdict"] == "not comparable" and none["reason"] == "no runs"
    # before vs after of one method: metric_a / metric_b
    same = [run("a", s, 0.9, before=0.7 + 0.01 * s) for s in range(3)]
    c = evaluate_claim(Claim("x", "a > a", "s", metric_a="final_accuracy", metric_b="before"), same)
    assert c["holds"] and c["mean_diff"] == pytest.approx(0.19)
    with pytest.raises(ValueError, match="cannot parse"):
        Claim("x", "a beats b", "s").parse()


def test_convergence_is_read_on_each_methods_mean_slope_over_seeds():
    # one noisy run above the limit, its method's mean curve flat: readable
    runs = [run("a", s, 0.9, slope=x) for s, x in enumerate((0.8, -0.6, 0.1))] + [
        run("b", s, 0.8, slope=0.1) for s in range(3)
    ]
    c = evaluate_claim(Claim("x", "a > b", "s"), runs)
    assert c["converged"] and c["holds"]
    assert c["method_slope"] == pytest.approx(0.1) and c["max_abs_slope"] == pytest.approx(0.8)
    # every seed still climbing: not readable, whatever the other method does
    for r in runs[:3]:
        r["slope"] = 0.6
    c = evaluate_claim(Claim("x", "a > b", "s"), runs)
    assert (
        not c["converged"]
        and c["verdict"] == "not comparable"
        and c["method_slope"] == pytest.approx(0.6)
    )


def test_last_quarter_slope_is_points_per_tenth_of_the_run():
    # 40 rounds, +0.1 point per round over the last quarter -> 0.4 points per 4 rounds
    per_round = [{"round": r, "accuracy": 0.5 + 0.001 * r} for r in range(1, 41)]
    assert last_quarter_slope(per_round, 40) == pytest.approx(0.4)
    assert last_quarter_slope([{"round": 40, "accuracy": 0.5}], 40) is None


def tiny_cell(seed, method="fedavg", algorithm="fedavg"):
    config = {
        "algorithm": algorithm,
        "dataset": "synthetic",
        "clients": 2,
        "rounds": 2,
        "train_samples": 200,
        "test_samples": 100,
        "eval_samples": 50,
        "steps": 2,
        "batch_size": 16,
        "model": "cnn",
        "tiers": ("1",),
        "width": 0.25,
        "min_size": 5,
    }
    return Cell(method, "synthetic", seed, config)


@pytest.mark.slow
def test_cells_are_cached_by_configuration_and_parallel_cells_equal_serial_ones(
    tmp_path, monkeypatch
):
    # Prepare: two cells, run one worker at a time and two at a time into separate caches
    cells = [tiny_cell(0), tiny_cell(1, method="local", algorithm="local")]
    serial = run_cells(cells, Cache(tmp_path / "serial", draft=True), workers=1, log=lambda m: None)
    parallel = run_cells(
        cells, Cache(tmp_path / "parallel", draft=True), workers=2, log=lambda m: None
    )
    # Assert: identical numbers, whichever worker ran a cell
    for s, p in zip(serial, parallel, strict=True):
        assert s["key"] == p["key"]
        assert (
            s["final_accuracy"] == p["final_accuracy"]
            and s["client_accuracy"] == p["client_accuracy"]
        )
        assert s["per_round"] == p["per_round"]
    assert len(list((tmp_path / "serial").glob("*.json"))) == 2
    # Execute again: everything comes from the cache, nothing runs
    monkeypatch.setattr(
        cache_module, "run_cell", lambda *a, **k: pytest.fail("a cached cell ran again")
    )
    again = run_cells(cells, Cache(tmp_path / "serial", draft=True), workers=2, log=lambda m: None)
    assert [r["final_accuracy"] for r in again] == [r["final_accuracy"] for r in serial]
    # a relabelled cell with the same configuration reuses the record under its own label
    relabelled = Cell("renamed", "elsewhere", 0, cells[0].config, role="sweep")
    hit = Cache(tmp_path / "serial", draft=True).get(relabelled)
    assert (
        hit["method"] == "renamed"
        and hit["role"] == "sweep"
        and hit["final_accuracy"] == serial[0]["final_accuracy"]
    )
    # two cells that spell one configuration differently run once and share the record
    monkeypatch.undo()
    spelled = Cell("spelled-out", "synthetic", 0, {**cells[0].config, "options": {}})
    assert spelled.key == cells[0].key and spelled != cells[0]
    logs: list[str] = []
    both = run_cells(
        [cells[0], spelled], Cache(tmp_path / "dedup", draft=True), workers=2, log=logs.append
    )
    assert "1 to run" in logs[0] and len(list((tmp_path / "dedup").glob("*.json"))) == 1
    assert (
        both[0]["final_accuracy"] == both[1]["final_accuracy"]
        and both[1]["method"] == "spelled-out"
    )


def test_the_cache_key_covers_resolved_defaults_and_options():
    from edgefl.algorithms import get_algorithm

    default = get_algorithm("felo").parse_options({}).alpha
    a = tiny_cell(0, algorithm="felo", method="felo")
    explicit_default = Cell(
        "felo", "synthetic", 0, {**a.config, "options": {"alpha": str(default)}}
    )
    other = Cell("felo", "synthetic", 0, {**a.config, "options": {"alpha": str(default * 2)}})
    assert a.key == explicit_default.key  # the default spelled out is the same run
    assert a.key != other.key and a.key != tiny_cell(1, algorithm="felo", method="felo").key


def full_run(cell, acc, **extra):
    """A record as run_cell makes it, by hand (for report tests that run nothing)."""
    return {
        "method": cell.method, "setting": cell.setting, "seed": cell.seed, "role": cell.role,
        "key": cell.key, "final_accuracy": acc, "per_tier": {"1": acc}, "client_accuracy": {},
        "slope": 0.1,
        "per_round": [{"round": 1, "accuracy": acc / 2}, {"round": 2, "accuracy": acc}],
        "bytes_up_per_device_round": 10.0,
        "bytes_down_per_device_round": 20.0,
        "wall_seconds": 1.0,
        "config": cell.full_config(),
        **extra,
    }


def test_a_missing_metric_is_reported_as_missing_not_raised():
    # Prepare: runs without the metric the claim names (e.g. one the toolkit does not produce yet)
    runs = [run("a", s, 0.9) for s in range(3)] + [run("b", s, 0.8, oracle=None) for s in range(3)]
    # Execute
    c = evaluate_claim(Claim("x", "a > b", "s", metric="oracle"), runs)
    before_after = evaluate_claim(
        Claim("y", "a > a", "s", metric_a="final_accuracy", metric_b="before"), runs
    )
    # Assert
    assert c["verdict"] == "not comparable" and not c["holds"] and c["mean_diff"] is None
    assert "oracle" in c["missing"] and c["reason"].startswith("metric missing")
    assert before_after["verdict"] == "not comparable" and "before" in before_after["missing"]


def test_a_sweep_or_claim_on_a_missing_metric_still_writes_the_report(tmp_path):
    # Prepare: a benchmark whose sweep and one claim name a metric no run has
    cells = [tiny_cell(s, method=m, algorithm=m) for s in range(3) for m in ("fedavg", "local")]
    sweep_cells = {
        v: [Cell("fedavg", "val", 0, {**cells[0].config, "lr": v}, role="sweep")]
        for v in (0.01, 0.1)
    }
    bench = runner.Benchmark(
        "t",
        "T",
        "tiny",
        cells,
        sweeps=[
            runner.Sweep("lr", (0.01, 0.1), sweep_cells, metric="oracle"),
            runner.Sweep("lr", (0.01, 0.1), sweep_cells),
        ],
        claims=[
            Claim("ok", "fedavg > local", "synthetic"),
            Claim("later", "fedavg > local", "synthetic", metric="oracle"),
        ],
        bounds={
            "centralized": [Cell("central", "bound", 0, cells[0].config, role="bound")],
            "local_iid": [Cell("local", "iid", 0, cells[0].config, role="bound")],
        },
    )
    records = {
        c: full_run(c, 0.8 + 0.01 * c.seed if c.method == "fedavg" else 0.5, code="0123abc")
        for c in cells
    }
    records.update({bench.bounds["centralized"][0]: full_run(bench.bounds["centralized"][0], 0.95),
                    bench.bounds["local_iid"][0]: full_run(bench.bounds["local_iid"][0], 0.8)})
    records.update(
        {c: full_run(c, 0.6 if v == 0.1 else 0.7) for v, cs in sweep_cells.items() for c in cs}
    )
    # Execute
    results = runner.build_results(bench, records, {}, {}, "cmd")
    page = runner.results_markdown(bench, results)
    # Assert
    verdicts = {c["id"]: c["verdict"] for c in results["claims"]}
    assert verdicts == {"ok": "reproduced", "later": "not comparable"}
    # the same cells from a tree that was not a clean commit answer nothing: the numbers alone stay
    # beside it
    dirty = {c: {**r, "code": "0123abc+dirty"} for c, r in records.items()}
    ok = next(
        c for c in runner.build_results(bench, dirty, {}, {}, "cmd")["claims"] if c["id"] == "ok"
    )
    assert (
        ok["verdict"] == "not comparable"
        and ok["statistic"] == "reproduced"
        and "not a clean commit" in ok["reason"]
    )
    missing, by_accuracy = results["sweeps"]
    assert missing["chosen"] is None and "oracle" in missing["missing"]
    assert by_accuracy["chosen"] == 0.01 and by_accuracy["validation_accuracy"] == pytest.approx(
        [0.7, 0.6]
    )
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
    derived = [
        d
        for st in ("hard", "easy")
        for d in runner.paired_difference(runs, "a", "b", st, method=st, as_setting="gain")
    ]
    # Assert: one derived run per seed and setting, every metric differenced, the larger slope kept
    assert len(derived) == 6
    hard = [d for d in derived if d["method"] == "hard"]
    assert hard[0]["final_accuracy"] == pytest.approx(0.05) and hard[0][
        "per_tier"
    ] == pytest.approx({"1": 0.08, "2": 0.02})
    assert hard[0]["slope"] == -0.3 and hard[0]["derived_from"] == ["a", "b", "hard"]
    assert evaluate_claim(Claim("x", "hard > easy", "gain"), derived)["holds"]
    tiers = evaluate_claim(
        Claim("t", "hard > hard", "gain", metric_a="per_tier.1", metric_b="per_tier.2"), derived
    )
    assert tiers["holds"] and tiers["mean_diff"] == pytest.approx(0.06)


def test_the_fedhenn_local_split_metric_weights_per_class_accuracy_by_the_device_labels():
    import torch

    from benchmarks.fedhenn import local_split_accuracy
    from edgefl.data import ArrayDataset
    from edgefl.data.datasets import DatasetInfo

    # Prepare: a "model" that always answers class 0, on a test set with classes 0 and 1 (3 images
    # each)
    class Zero(torch.nn.Module):
        def forward(self, x):
            return torch.tensor([[1.0, 0.0]]).repeat(len(x), 1)

    info = DatasetInfo(
        name="t", num_classes=2, in_shape=(1, 2, 2), mean=(0.0,), std=(1.0,), class_names=("a", "b")
    )
    data = ArrayDataset(
        torch.zeros(6, 1, 2, 2, dtype=torch.uint8), torch.tensor([0, 0, 0, 1, 1, 1]), info
    )
    # Assert: a device holding only class 0 sees 100 %, a balanced one 50 %, a class-1 one 0 %
    assert local_split_accuracy(Zero(), data, [5, 0]) == pytest.approx(1.0)
    assert local_split_accuracy(Zero(), data, [3, 3]) == pytest.approx(0.5)
    assert local_split_accuracy(Zero(), data, [0, 7]) == pytest.approx(0.0)


@pytest.mark.slow
def test_record_extras_are_merged_into_the_record_and_cached_under_their_hook(
    tmp_path, monkeypatch
):
    seen = {}

    def hook(out):
        seen["run_dir_exists"] = (out.run_dir / "rounds.jsonl").exists()
        seen["rounds"] = len(out.rounds)
        return {
            "rounds_seen": len(out.rounds),
            "first_round_accuracy": out.rounds[0]["eval"]["mean_accuracy"],
        }

    monkeypatch.setattr(cells_module, "load_hook", lambda spec: hook)
    cell = tiny_cell(0)
    # Execute
    record = runner.run_cell(cell, (), "tests:hook")
    # Assert: the hook saw the live run directory and its rounds; its keys are in the record
    assert seen == {"run_dir_exists": True, "rounds": 2} and record["rounds_seen"] == 2
    assert record["first_round_accuracy"] == record["per_round"][0]["accuracy"]
    assert record["extras_from"] == "tests:hook"
    # a record made with the hook is a hit for the hook, a miss for a benchmark without it (and
    # back)
    Cache(tmp_path, "tests:hook").put(cell, record)
    assert Cache(tmp_path, "tests:hook").get(cell)["rounds_seen"] == 2
    assert Cache(tmp_path).get(cell) is None
    # a hook may not overwrite what the runner measured
    monkeypatch.setattr(cells_module, "load_hook", lambda spec: lambda out: {"final_accuracy": 1.0})
    with pytest.raises(ValueError, match="already has"):
        runner.run_cell(cell, (), "tests:clash")


def test_prepare_runs_once_before_cells_that_still_have_to_run(tmp_path):
    calls = []
    cells = [tiny_cell(0)]

    def make(quick):
        return runner.Benchmark(
            "t",
            "T",
            "tiny",
            cells,
            prepare=lambda: calls.append(len(list((tmp_path / "cells").glob("*.json")))),
        )

    runner.main(make, ["--out", str(tmp_path), "--workers", "1", "--draft"])
    assert calls == [0]  # before the first cell ran
    runner.main(make, ["--out", str(tmp_path), "--workers", "1", "--draft"])
    ran = json.loads((tmp_path / "results.json").read_text())
    ran["machine"]["before"]["date"] = "the day the cells ran"
    (tmp_path / "results.json").write_text(json.dumps(ran))
    runner.main(make, ["--out", str(tmp_path), "--report-only", "--draft"])
    assert calls == [0]  # everything cached: nothing to prepare
    reported = json.loads((tmp_path / "results.json").read_text())
    # a report rewritten from the cache keeps the machine of the run that made the cells, and says
    # which commits its cells come from
    assert reported["machine"] == ran["machine"]
    assert reported["provenance"]["commits"] == {ran["runs"][0]["code"]: 1}


def test_a_sweep_keeps_the_default_when_the_best_value_is_within_the_noise():
    base = tiny_cell(0).config
    cells = {
        v: [Cell("m", "val", s, {**base, "lr": v}, role="sweep") for s in (0, 1)]
        for v in (0.01, 0.1, 1.0)
    }
    acc = {0.01: (0.700, 0.720), 0.1: (0.705, 0.725), 1.0: (0.50, 0.52)}
    records = {c: {"final_accuracy": acc[v][c.seed]} for v, cs in cells.items() for c in cs}
    close = runner.evaluate_sweep(
        runner.Sweep("lr", (0.01, 0.1, 1.0), cells, default=0.01), records
    )
    assert close["best"] == 0.1 and close["chosen"] == 0.01 and close["kept_default"]
    acc[0.1] = (0.80, 0.82)  # beats the default by far more than its sd
    records = {c: {"final_accuracy": acc[v][c.seed]} for v, cs in cells.items() for c in cs}
    far = runner.evaluate_sweep(runner.Sweep("lr", (0.01, 0.1, 1.0), cells, default=0.01), records)
    assert far["chosen"] == 0.1 and not far["kept_default"]
    assert (
        runner.evaluate_sweep(runner.Sweep("lr", (0.01, 0.1, 1.0), cells), records)["chosen"] == 0.1
    )
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
    assert (
        samples["shape"][:2] == [len(samples["classes"]), fedvtc.SAMPLES_PER_CLASS]
        and samples["classes"]
    )
    assert samples["shape"][2:] == [28, 28]
    assert (tmp_path / "samples_synthetic.png").stat().st_size > 1000
    assert "samples_synthetic.png" in page


@pytest.mark.slow
def test_fedhenn_records_the_local_split_accuracy_of_every_device(tmp_path):
    # Prepare: a tiny FedHeNN cell on shards of 2 classes, its record made with the benchmark's hook
    config = {**tiny_cell(0).config, "algorithm": "fedhenn", "clients": 3, "partition": "shards",
              "classes_per_client": 2, "public_fraction": 0.1, "options": {"rad_size": "20"}}
    # Execute
    record = runner.run_cell(
        Cell("fedhenn", "synthetic", 0, config), (), "benchmarks.fedhenn:extras"
    )
    # Assert: one local accuracy per device, their mean recorded, each a share
    local = record["client_local_accuracy"]
    assert set(local) == set(record["client_accuracy"]) and len(local) == 3
    assert all(0.0 <= a <= 1.0 for a in local.values())
    assert record["local_accuracy"] == pytest.approx(sum(local.values()) / 3)


def test_a_metric_can_be_the_difference_of_two():
    record = {
        "method": "m",
        "setting": "s",
        "seed": 0,
        "final_accuracy": 0.7,
        "accuracy_before_finetune": 0.65,
    }
    assert runner.metric_value(
        record, "final_accuracy - accuracy_before_finetune"
    ) == pytest.approx(0.05)
    with pytest.raises(runner.MetricMissing, match="nothing"):
        runner.metric_value(record, "final_accuracy - nothing")


def test_an_option_added_later_keys_a_cell_only_when_it_changes_the_computation():
    # Prepare: a FedVTC cell at the defaults, one with the later option set, and the key the cell
    # had before the option existed (its resolved options without it)
    config = {"algorithm": "fedvtc", "dataset": "synthetic", "rounds": 1}
    # the computation from before the options existed
    paper = {"proto_rc_weight": "0", "psi_bn": "average"}
    plain = Cell("fedvtc", "s", 0, {**config, "options": paper})
    proto = Cell("fedvtc", "s", 0, {**config, "options": {**paper, "proto_rc_weight": "10"}})
    keyed_without = runner.resolved_run(plain)["options"]
    # Assert: at the value that reproduces the old computation the option is not in the key; another
    # value is
    assert "proto_rc_weight" not in keyed_without and "psi_bn" not in keyed_without
    assert runner.resolved_run(proto)["options"]["proto_rc_weight"] == 10.0
    assert plain.key != proto.key
    # a later default that differs from the old computation is keyed (every cell re-runs)
    # the method's default (10) is not the old computation: a cell that does not set it is keyed
    # with it
    default = Cell("fedvtc", "s", 0, config)
    assert (
        runner.resolved_run(default)["options"]["proto_rc_weight"] == 10.0
        and default.key != plain.key
    )


# -- sanity gates (benchmarks/gates.py) ------------------------------------------------------------
def gated(method, seed, acc, setting="s", algorithm="fedavg", **extra):
    """A record with what the gates read: per-device class counts and, if given, predictions."""
    counts = {"d0": [50, 50, 0, 0], "d1": [0, 0, 50, 50]}
    return {
        **run(method, seed, acc, setting=setting),
        "config": {"algorithm": algorithm},
        "client_class_counts": counts,
        "client_accuracy": {"d0": acc, "d1": acc},
        **extra,
    }


def test_the_bounds_gate_fails_below_a_federated_method_or_a_weak_local_iid():
    from benchmarks import gates

    runs = [gated("fedavg", s, 0.86 + 0.001 * s) for s in range(3)] + [
        gated("local", s, 0.95, algorithm="local") for s in range(3)
    ]
    # the centralized bound 0.80 is 6 points under FedAvg (sd 0.1): beyond the noise; Local (not
    # federated) is not compared
    failures = gates.bounds_failures(
        {"centralized": [{"final_accuracy": 0.80}], "local_iid": [{"final_accuracy": 0.78}]}, runs
    )
    assert len(failures) == 1 and "fedavg in s" in failures[0] and "local in s" not in failures[0]
    # a bound above every method by more than the noise, but Local-IID under 75 %: fails on that
    # alone
    failures = gates.bounds_failures(
        {"centralized": [{"final_accuracy": 0.90}], "local_iid": [{"final_accuracy": 0.72}]}, runs
    )
    assert len(failures) == 1 and "Local-IID 72.0 %" in failures[0]
    assert (
        gates.bounds_failures(
            {"centralized": [{"final_accuracy": 0.90}], "local_iid": [{"final_accuracy": 0.80}]},
            runs,
        )
        == []
    )
    # a benchmark that declares no bounds has nothing to check its runs against: it fails, never
    # "passes"
    assert gates.bounds_failures({}, runs) == [
        "no centralized bound runs (the protocol asks for both bounds)",
        "no Local-IID runs (the protocol asks for both bounds)",
    ]


def test_a_collapsed_run_is_listed_and_a_claim_over_it_is_not_comparable():
    from benchmarks import gates

    # measured: d0 holds two classes but predicts only class 0 (100 of 100 predictions)
    one = gated("a", 0, 0.6, client_predictions={"d0": [100, 0, 0, 0], "d1": [0, 0, 50, 50]})
    assert gates.collapsed_devices(one) == (["d0"], "measured")
    # a device holding one class that predicts it is its data, not a collapse
    single = gated(
        "a",
        0,
        0.6,
        client_class_counts={"d0": [100, 0, 0, 0]},
        client_predictions={"d0": [100, 0, 0, 0]},
    )
    assert gates.collapsed_devices(single) == ([], "measured")
    # proxy (cells without predictions): a device at what a single-class predictor scores, 1 /
    # classes
    proxy = gated("a", 0, 0.6, client_accuracy={"d0": 0.26, "d1": 0.6})
    assert gates.collapsed_devices(proxy) == (["d0"], "proxy")
    # a run within 5 points of chance
    assert any("chance" in r for r in gates.run_collapse(gated("a", 0, 0.28)))
    # Execute: a claim over a collapsed run (seed 1 of b) reads "not comparable", naming it
    runs = [gated("a", s, 0.9 - 0.01 * s) for s in range(3)] + [
        gated("b", s, 0.7) for s in range(3)
    ]
    runs[4]["client_predictions"] = {"d0": [100, 0, 0, 0], "d1": [0, 0, 50, 50]}
    gate = gates.evaluate({}, runs)
    assert list(gate["collapsed"]) == ["b|s|1"]
    c = evaluate_claim(Claim("x", "a > b", "s"), runs, collapsed=gate["collapsed"])
    assert (
        c["verdict"] == "not comparable"
        and c["statistic"] == "reproduced"
        and "b seed 1" in c["reason"]
    )
    # a failed bounds gate makes every claim not comparable, the numbers alone still shown
    c = evaluate_claim(
        Claim("x", "a > b", "s"), runs, gate_failures=["Local-IID 70.0 % is under 75 %"]
    )
    assert (
        c["verdict"] == "not comparable"
        and "sanity gates" in c["reason"]
        and "numbers alone: reproduced" in c["reason"]
    )


# -- provenance (benchmarks/provenance.py) ---------------------------------------------------------
def test_the_cache_is_keyed_by_the_code_hash_and_keeps_pre_provenance_cells_for_reports_only(
    tmp_path,
):
    cell = tiny_cell(0)
    record = full_run(
        cell, 0.8, code="abc1234", code_hash="aaaa", draft=False, finished_at="2026-01-01T00:00:00"
    )
    Cache(tmp_path, code_hash="aaaa").put(cell, record)
    assert Cache(tmp_path, code_hash="aaaa").get(cell)["final_accuracy"] == 0.8
    # other code: a run never reuses it; a report finds it (and marks it, below)
    assert Cache(tmp_path, code_hash="bbbb").get(cell) is None
    assert Cache(tmp_path, code_hash="bbbb").find(cell)["code_hash"] == "aaaa"
    # a cell cached before code hashes existed (<key>.json, no code_hash): reports only
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / f"{cell.key}.json").write_text(json.dumps(full_run(cell, 0.7, code="old+dirty")))
    assert Cache(legacy, code_hash="bbbb").get(cell) is None
    found = Cache(legacy, code_hash="bbbb").find(cell)
    assert found["final_accuracy"] == 0.7
    from benchmarks import provenance

    assert provenance.cell_provenance(found, "bbbb") == provenance.PRE_PROVENANCE
    assert provenance.cell_provenance(record, "bbbb") == "other code"
    # a draft is reused only by a draft
    Cache(tmp_path / "d", code_hash="cccc", draft=True).put(
        cell, {**record, "draft": True, "code_hash": "cccc"}
    )
    assert Cache(tmp_path / "d", code_hash="cccc").get(cell) is None
    assert Cache(tmp_path / "d", code_hash="cccc", draft=True).get(cell) is not None


def test_the_code_hash_follows_the_code(tmp_path, monkeypatch):
    from benchmarks import provenance

    package = tmp_path / "edgefl"
    package.mkdir()
    (package / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(provenance, "PACKAGE", package)
    provenance.code_hash.cache_clear()
    try:
        first = provenance.code_hash(None)
        provenance.code_hash.cache_clear()
        (package / "a.py").write_text("x = 2\n")
        assert provenance.code_hash(None) != first
    finally:
        provenance.code_hash.cache_clear()


def test_cells_from_dirty_code_are_refused_unless_a_draft(tmp_path, monkeypatch):
    from benchmarks import provenance

    monkeypatch.setattr(provenance, "code_version", lambda record_extras=None: "abc1234+dirty")
    monkeypatch.setattr(
        runner, "run_cell", lambda *a, **k: pytest.fail("a cell ran from dirty code")
    )
    with pytest.raises(runner.DirtyCode, match="--draft"):
        run_cells([tiny_cell(0)], Cache(tmp_path, code_hash="h"), workers=1, log=lambda m: None)
    with pytest.raises(SystemExit, match="draft"):
        runner.main(
            lambda quick: runner.Benchmark("t", "T", "tiny", [tiny_cell(0)]),
            ["--out", str(tmp_path), "--workers", "1"],
        )


def test_claims_over_cells_older_than_the_declaration_are_marked_undeclared_settings_not_counted(
    tmp_path,
):
    cells = [tiny_cell(s, method=m, algorithm=m) for s in range(3) for m in ("fedavg", "local")]
    bench = runner.Benchmark(
        "t", "T", "tiny", cells, claims=[Claim("ok", "fedavg > local", "synthetic")]
    )
    records = {
        c: full_run(c, 0.8 + 0.01 * c.seed if c.method == "fedavg" else 0.5, code="abc1234")
        for c in cells
    }
    # no declared.json: counted as the paper's claim, nothing to mark
    plain = runner.build_results(bench, records, {}, {}, "cmd", bench_dir=tmp_path)
    assert plain["claims"][0]["counted"] and "before_declaration" not in plain["claims"][0]
    # declared, but not committed (and the setting is an alternative): marked, not counted
    (tmp_path / "declared.json").write_text(
        json.dumps({"main": ["other"], "alternatives": ["synthetic"]})
    )
    results = runner.build_results(bench, records, {}, {}, "cmd", bench_dir=tmp_path)
    c = results["claims"][0]
    assert c["declared"] == "alternative" and not c["counted"] and c["before_declaration"]
    assert c["commits"] == ["abc1234"] and results["provenance"]["commits"] == {"abc1234": 6}
    page = runner.results_markdown(bench, results)
    assert (
        "Claims reproduced: 0 of 0" in page
        and "alternatives (not counted)" in page
        and "` † |" in page
    )


# -- the reviewer's check --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name", ["felo_velo", "fedvtc", "hierarchyfl", "fedhenn", "feddw", "foundation"]
)
def test_every_benchmarks_quick_profile_takes_the_reviewers_cells(name):
    import importlib

    bench = importlib.import_module(f"benchmarks.{name}").make(True)
    claim = next(
        c
        for c in bench.claims
        if c.setting in {x.setting for x in bench.cells} and c.parse()[0] != c.parse()[2]
    )
    a, _, b = claim.parse()
    cells = runner.reviewer_cells(bench, [a, b], claim.setting, [101, 102, 103])
    assert [(c.method, c.seed) for c in cells] == [(m, s) for m in (a, b) for s in (101, 102, 103)]
    template = next(c for c in bench.cells if c.method == a and c.setting == claim.setting)
    # the same run, another seed
    assert cells[0].config == template.config and cells[0].key != template.key
    with pytest.raises(SystemExit, match="settings"):
        runner.reviewer_cells(bench, [a], "no-such-setting", [1])


@pytest.mark.slow
def test_the_reviewers_check_runs_chosen_cells_with_new_seeds_into_its_own_folder(
    tmp_path, capfd, monkeypatch
):
    cells = [tiny_cell(s, method=m, algorithm=m) for s in range(3) for m in ("fedavg", "local")]
    bench = runner.Benchmark(
        "t",
        "T",
        "tiny",
        cells,
        claims=[
            Claim("c", "fedavg > local", "synthetic"),
            Claim("n", "fedavg ≥ local", "synthetic", kind="not worse"),
        ],
    )
    out = tmp_path / "check"
    monkeypatch.chdir(tmp_path)  # any directory
    result = runner.main(
        lambda quick: bench,
        [
            "--cells",
            "fedavg,local",
            "--setting",
            "synthetic",
            "--seeds",
            "7,8,9",
            "--out",
            str(out),
            "--workers",
            "2",
            "--draft",
        ],
    )
    printed = capfd.readouterr().out
    # Assert: its own cells with the reviewer's seeds, a verdict per claim, progress per round
    assert sorted((r["method"], r["seed"]) for r in result["runs"]) == [
        (m, s) for m in ("fedavg", "local") for s in (7, 8, 9)
    ]
    assert {c["id"] for c in result["claims"]} == {"c", "n"}
    assert all(c["verdict"] in runner.VERDICTS + ("not worse", "worse") for c in result["claims"])
    assert (
        "fedavg > local [synthetic]" in printed
        and "round 2/2" in printed
        and "round 3/2" not in printed
    )
    assert json.loads((out / "check.json").read_text())["seeds"] == [7, 8, 9]
    assert len(list((out / "cells").glob("*.json"))) == 6
    # run directories lived there, and are gone
    assert (out / "tmp").is_dir() and not list((out / "tmp").iterdir())
    assert not (runner.BENCHMARKS / "t").exists()


def test_a_benchmark_runs_from_any_directory(tmp_path):
    """As its page says: ``PYTHONPATH=/path/to/repo python -m benchmarks.<name> …`` (no benchmark
    edits sys.path)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(runner.ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.foundation", "--help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "--seeds" in done.stdout


def test_device_class_counts_read_each_devices_shard_past_the_public_carve_out():
    from benchmarks.common import device_class_counts

    # Prepare: shards of 2 classes with 10 % of the training images carved out for the server first
    config = {**tiny_cell(0).config, "clients": 4, "partition": "shards", "classes_per_client": 2,
              "public_fraction": 0.1, "train_samples": 400, "tiers": ("1",)}
    # Execute
    counts = device_class_counts(config)
    # Assert: every device holds exactly its two classes (indexing the whole training set instead of
    # the pool left after the carve-out gave every device a spread over all classes)
    assert len(counts) == 4
    for _, per_class in counts.values():
        assert sum(c > 0 for c in per_class) == 2
    # (with 8 shards for 10 classes the partition uses 8 of them: at most the 360 images left)
    assert 0 < sum(sum(c) for _, c in counts.values()) <= 400 - 40


@pytest.mark.slow
def test_partial_reports_the_cells_that_finished_and_lists_the_missing(tmp_path):
    cells = [tiny_cell(s, method=m, algorithm=m) for s in range(3) for m in ("fedavg", "local")]
    bench = runner.Benchmark("t", "T", "tiny", cells,
                             claims=[Claim("c", "fedavg > local", "synthetic")])
    # seed 2 never ran
    run_cells(cells[:4], Cache(tmp_path / "cells", draft=True), workers=1, log=lambda m: None)
    args = ["--out", str(tmp_path), "--report-only", "--draft"]
    assert runner.main(lambda quick: bench, args) == {}  # without --partial: nothing written
    assert not (tmp_path / "results.json").exists()
    results = runner.main(lambda quick: bench, [*args, "--partial"])
    assert results["missing"] == [c.label for c in cells[4:]]
    assert [r["seed"] for r in results["runs"]] == [0, 0, 1, 1]
    claim = results["claims"][0]
    assert claim["seeds"] == [0, 1] and claim["verdict"] == "not comparable"
    page = (tmp_path / "results.md").read_text()
    assert "**Incomplete: 2 cells of the declared grid did not run**" in page
    assert "`grid:synthetic:fedavg:s2`" in page
