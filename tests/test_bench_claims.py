"""The benchmark runner's reading of results: claims evaluated by code, convergence, missing and
derived metrics, sweeps, the bounds and collapse gates, undeclared settings."""

from __future__ import annotations

import json

import pytest

from benchmarks import runner
from benchmarks.cells import legacy_curve
from benchmarks.pages import sweep_line
from benchmarks.runner import Cell, Claim, evaluate_claim, last_quarter_slope
from tests.bench_cases import full_run, gated, run, tiny_cell


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
    assert "of rounds (a)" in c["reason"]  # the method still rising is named, not b
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


def test_a_method_whose_seeds_spread_over_five_points_needs_five_seeds():
    # Prepare: a beats b by 10 points on every seed, but a's three seeds span 6 points
    runs = [run("a", s, 0.60 + 0.03 * s) for s in range(3)] + [
        run("b", s, 0.50 + 0.03 * s) for s in range(3)]
    # Execute
    c = evaluate_claim(Claim("x", "a > b", "s"), runs)
    # Assert: not comparable, both methods named with their spread; the numbers alone reproduce it
    assert c["verdict"] == "not comparable" and c["statistic"] == "reproduced"
    assert "3 seeds where the protocol reads ≥ 5: a's spread over 6.0 points, b's spread over " \
           "6.0 points (> 5)" in c["reason"]
    # five seeds answer it; so do three within 5 points
    five = [run("a", s, 0.60 + 0.015 * s) for s in range(5)] + [
        run("b", s, 0.50 + 0.015 * s) for s in range(5)]
    assert evaluate_claim(Claim("x", "a > b", "s"), five)["verdict"] == "reproduced"
    narrow = [run("a", s, 0.60 + 0.02 * s) for s in range(3)] + [
        run("b", s, 0.50 + 0.02 * s) for s in range(3)]
    assert evaluate_claim(Claim("x", "a > b", "s"), narrow)["verdict"] == "reproduced"
    # a metric not in points (seconds to a target) has no such rule
    timed = [run("a", s, 0.6, t=100.0 + 50 * s) for s in range(3)] + [
        run("b", s, 0.6, t=300.0 + 50 * s) for s in range(3)]
    assert evaluate_claim(Claim("x", "a < b", "s", metric="t"), timed)["verdict"] == "reproduced"


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


def test_the_slope_reads_the_per_round_evaluations_alone_never_the_final_one():
    # a flat curve on the per-round split, closed by the final evaluation 3 points higher (another,
    # larger set): that point would read as a rising curve (0.9 points per 10 % of rounds)
    flat = [{"round": r, "accuracy": 0.70} for r in range(1, 16)]
    closed = [*flat, {"round": 16, "accuracy": 0.73}]
    assert last_quarter_slope(closed, 16) == pytest.approx(0.96)
    assert last_quarter_slope([*flat, {"round": 16, "accuracy": 0.73, "final": True}], 16) == 0.0
    # a record made before the final point was marked: the point equal to the final accuracy at the
    # last round is marked where the per-round split is the smaller one
    legacy = {"per_round": closed, "final_accuracy": 0.73, "slope": 0.96,
              "resolved_config": {"rounds": 16, "eval_samples": 500, "test_samples": 2000}}
    read = legacy_curve(legacy)
    assert read["slope"] == 0.0 and read["per_round"][-1]["final"] and legacy["slope"] == 0.96
    # on the same images the two evaluations are one number: the point stays
    same = {**legacy, "resolved_config": {**legacy["resolved_config"], "eval_samples": 2000}}
    assert legacy_curve(same)["slope"] == pytest.approx(0.96)
    # a run that stopped early, or a last point that is not the final accuracy: as it is
    failed = {**legacy, "stopped_at_round": 9, "stop_reason": "every device failed"}
    assert legacy_curve(failed)["slope"] == pytest.approx(0.96)
    # a run whose privacy budget was spent ran to its end: its curve was closed as any other
    spent = {**legacy, "stopped_at_round": 9, "stop_reason": "privacy budget spent"}
    assert legacy_curve(spent)["slope"] == 0.0
    assert legacy_curve({**legacy, "final_accuracy": 0.72})["slope"] == pytest.approx(0.96)
    # a record made since: as it is
    assert legacy_curve({**legacy, "final_point_marked": True}) == {**legacy,
                                                                    "final_point_marked": True}


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

    from benchmarks.fedhenn.extras import local_split_accuracy
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
    # Assert: the page says when the grid runs a default the sweep did not choose
    assert "not the default 0.01 the grid runs" in sweep_line(far)
    assert "not the default" not in sweep_line(close) and "within the noise" in sweep_line(close)


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


def test_a_page_compares_each_claims_sign_with_an_earlier_profiles(tmp_path):
    from benchmarks.pages import against_previous

    def claim(cid, kind, diff, sd, signs, verdict="not reproduced"):
        return {"id": cid, "kind": kind, "statement": f"{cid} claim", "setting": "s",
                "mean_diff": diff, "sd": sd, "signs": signs, "verdict": verdict}

    earlier = tmp_path / "results.json"
    assert against_previous({"claims": [], "bounds": {}}, earlier, "## H", "Before") == []
    earlier.write_text(json.dumps({"bounds": {"centralized": 0.86, "local_iid": None}, "claims": [
        claim("kept", "paper", 0.05, 0.01, [1, 1, 1]),       # clear before, kept
        claim("flipped", "control", 0.05, 0.01, [1, 1, 1]),  # clear before, flipped
        claim("noise", "implied", -0.01, 0.02, [-1, 1, -1]),  # within the noise before
        claim("byconstruction", "not worse", 0.05, 0.01, [1, 1, 1]),
    ]}))
    now = {"bounds": {"centralized": 0.87, "local_iid": 0.78}, "claims": [
        claim("kept", "paper", 0.03, 0.01, [1, 1, 1], "reproduced"),
        claim("flipped", "control", -0.02, 0.01, [-1, -1, -1], "reversed"),
        claim("noise", "implied", 0.01, 0.02, [1, 1, -1]),
        claim("byconstruction", "not worse", 0.05, 0.01, [1, 1, 1]),
        claim("new", "paper", 0.01, 0.01, [1, 1, 1]),  # no earlier counterpart: no row
    ]}
    lines = against_previous(now, earlier, "## H", "Before")
    text = "\n".join(lines)
    assert lines[0] == "## H" and lines[2].startswith("Before against this run")
    assert "centralized 86.0 % → 87.0 %" in text and "local_iid" not in text
    assert "Signs kept: paper 1 of 1; control 0 of 1; implied 0 of 1" in text
    assert "every seed agreeing, 1 of 2" in text
    rows = [line for line in lines if line.startswith("| `")]
    assert [r.split("`")[1] for r in rows] == ["kept claim", "flipped claim", "noise claim"]
    assert "| +5.00 ± 1.00 (+ + +) | -2.00 ± 1.00 (− − −) | **no** | reversed |" in rows[1]
