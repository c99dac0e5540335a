"""The rule of benchmarks/foundation/recipes.py: which recipe the stability sweep chooses."""

from __future__ import annotations

from benchmarks.foundation import recipes

BALANCED = {"d0": [50, 50], "d1": [50, 50]}


def record(cell, curve, predictions=None):
    """A finished sweep run: its accuracy per evaluation (the last one final) and what each device's
    model predicts (two classes each unless given)."""
    return {
        "method": cell.method,
        "setting": cell.setting,
        "seed": cell.seed,
        "final_accuracy": curve[-1],
        "per_round": [{"round": i + 1, "accuracy": a} for i, a in enumerate(curve)],
        "slope": 0.1,
        "client_class_counts": BALANCED,
        "client_predictions": predictions or {"d0": [60, 40], "d1": [45, 55]},
    }


def sweep(outcome):
    """Every cell of the sweep run, with the curve ``outcome(cell)`` gives."""
    every = recipes.cells()
    return [record(c, *outcome(c)) for c in every], every


def test_the_stable_recipe_with_the_better_mean_is_chosen():
    records, every = sweep(lambda c: ([0.7, 0.8 if c.method == "sgd 0.01 m0.9" else 0.75],))
    result = recipes.summarize(records, every)
    assert result["status"] == {"sgd 0.01 m0.9": "stable", "sgd 0.05 m0.9": "stable"}
    assert result["chosen"] == "sgd 0.01 m0.9" and result["chosen_recipe"]["lr"] == 0.01
    assert not result["not_run"]


def test_a_collapsed_run_or_a_declining_bound_rules_a_recipe_out():
    def outcome(c):
        if (
            c.method == recipes.CURRENT
            and c.setting == "centralized"
            and c.seed == recipes.SEEDS[0]
        ):
            # better on average, but the bound declines 5.4 points from its peak
            return ([0.83, 0.776],)
        return ([0.7, 0.9 if c.method == recipes.CURRENT else 0.8],)

    records, every = sweep(outcome)
    result = recipes.summarize(records, every)
    assert result["status"][recipes.CURRENT] == "unstable" and result["chosen"] == "sgd 0.01 m0.9"
    row = next(
        r
        for r in result["rows"]
        if r["recipe"] == recipes.CURRENT and r["setting"] == "centralized"
    )
    assert "declined 5.4 points" in row["unstable"][recipes.SEEDS[0]][0]

    # a device predicting one class while it holds two: collapsed, whatever the mean
    one_class = {"d0": [100, 0], "d1": [45, 55]}
    records, every = sweep(
        lambda c: (
            [0.7, 0.9 if c.method == recipes.CURRENT else 0.8],
            one_class if c.method == recipes.CURRENT and c.seed == 12 else None,
        )
    )
    result = recipes.summarize(records, every)
    assert result["status"][recipes.CURRENT] == "unstable" and result["chosen"] == "sgd 0.01 m0.9"


def test_nothing_is_chosen_while_a_candidate_that_could_win_has_cells_to_run():
    records, every = sweep(lambda c: ([0.7, 0.8],))
    partial = [None if r["method"] == recipes.CURRENT and r["seed"] == 14 else r for r in records]
    result = recipes.summarize(partial, every)
    assert result["status"][recipes.CURRENT] == "undecided" and result["chosen"] is None
    assert len(result["not_run"]) == 2 and "Not decided yet" in recipes.markdown(
        {
            **result,
            "machine": {"before": {}, "after": {}},
            "commits": {},
            "wall_seconds": [],
            "command": "c",
        }
    )
