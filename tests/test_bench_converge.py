"""The rule of benchmarks/foundation/converge.py: which run length / lr schedule each profile
takes."""

from __future__ import annotations

from benchmarks.foundation import converge

BALANCED = {"d0": [50, 50], "d1": [50, 50]}


def record(cell, final, slope=0.1):
    return {
        "method": cell.method,
        "setting": cell.setting,
        "seed": cell.seed,
        "final_accuracy": final,
        "per_round": [{"round": 1, "accuracy": final - 0.01}, {"round": 2, "accuracy": final}],
        "slope": slope,
        "client_class_counts": BALANCED,
        "client_predictions": {"d0": [60, 40], "d1": [45, 55]},
    }


def run(outcome):
    every = converge.cells()
    return converge.summarize([record(c, *outcome(c)) for c in every], every), every


def accuracy(c, better="step70"):
    """The centralized bound above the rest, the ``better`` candidate one point up."""
    base = 0.88 if c.setting == "centralized" else 0.80
    return base + (0.01 if c.method.endswith(better) else 0.0)


def test_every_candidate_passing_the_best_mean_is_chosen():
    result, _ = run(lambda c: (accuracy(c, "constant"),))
    assert result["chosen"] == {"server_opt": "constant", "foundation": "step70"}
    assert all(v["status"] == "passes" for v in result["verdicts"].values())


def test_a_slope_a_low_local_iid_or_a_bound_below_a_method_rule_a_candidate_out():
    # constant is better on average, but FedAvg has not converged under it
    def slope(c):
        late = c.method == "server_opt constant" and c.setting == "fedavg dir0.5"
        return accuracy(c, "constant"), 0.6 if late else 0.1

    result, _ = run(slope)
    assert result["chosen"]["server_opt"] == "step70"
    why = result["verdicts"]["server_opt constant"]["why"]
    assert "fedavg dir0.5: mean slope 0.60 ≥ 0.5" in why

    def low_local(c):
        return (0.74 if c.setting == "local iid" else accuracy(c),)

    result, _ = run(low_local)
    assert result["chosen"]["server_opt"] is None
    assert any("Local-IID 74.00 % < 75 %" in w
               for w in result["verdicts"]["server_opt step70"]["why"])

    def low_bound(c):
        return (0.79 if c.setting == "centralized" else accuracy(c),)

    result, _ = run(low_bound)
    assert result["chosen"] == {"server_opt": None, "foundation": None}
    assert any("not above" in w for w in result["verdicts"]["foundation step70"]["why"])


def test_nothing_is_chosen_while_a_candidate_has_cells_to_run():
    every = converge.cells()
    records = [None if c.method == "server_opt constant" and c.seed == converge.SEEDS[-1]
               else record(c, accuracy(c)) for c in every]
    result = converge.summarize(records, every)
    assert result["verdicts"]["server_opt constant"]["status"] == "undecided"
    assert result["chosen"]["server_opt"] is None and result["chosen"]["foundation"] == "step70"


def test_the_ceiling_rule_reads_twice_the_epochs_against_the_noise_and_all_data_against_90():
    from benchmarks.foundation import ceiling

    every = ceiling.cells()
    ref = ceiling.reference()  # the committed converge.json's 30-epoch bound: 87.20 ± 1.15 %
    assert [round(100 * x, 1) for x in ref["final"]] == [86.8, 88.5, 86.3]

    def summary(longer, everything):
        got = [record(c, longer if c.method == "twice the epochs" else everything)
               for c in every]
        return ceiling.summarize(got, every)["status"]

    # Assert: within the noise of the bound is its ceiling; 90 % is read on the all-data mean
    flat = summary(ref["mean"] + 0.005, 0.905)
    assert flat["ceiling"].startswith("at its ceiling") and flat["ninety"].startswith("reaches 90")
    climbing = summary(ref["mean"] + 0.03, 0.895)
    assert climbing["ceiling"].startswith("not at its ceiling")
    assert climbing["ninety"].startswith("does not reach 90 %")
    # a candidate short of its seeds decides nothing
    partial = ceiling.summarize([None] * len(every), every)["status"]
    assert partial == {"ceiling": "undecided", "ninety": "undecided"}


def test_feddws_baseline_sweep_moves_a_grid_value_only_beyond_its_paired_noise():
    from benchmarks.feddw import baselines

    every = baselines.cells()
    bump = {"fedprox.mu=0.1": 0.02, "feddw.lam=1000.0": 0.004}

    def summary(spread):
        # the two settings 40 points apart (not noise once paired); a value's bump over its grid
        # value, with a per-seed spread around it
        got = [record(c, (0.8 if c.setting == "sweep-practical" else 0.4)
                      + bump.get(c.method, 0.0) * (1 + spread * (-1) ** c.seed))
               for c in every]
        return baselines.summarize(got, every)

    steady = summary(0.1)
    assert steady["chosen"] == {"fedprox.mu": "0.1", "feddw.lam": "1000.0"}
    noisy = summary(3.0)  # the same means, paired differences that swing through zero
    assert noisy["chosen"] == {"fedprox.mu": "0.01", "feddw.lam": "100.0"}
    assert "within the noise" in noisy["status"]["fedprox.mu"]
    assert baselines.summarize([None] * len(every), every)["status"] == {
        "fedprox.mu": "undecided", "feddw.lam": "undecided"}
