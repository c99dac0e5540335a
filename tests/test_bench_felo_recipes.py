"""The rule of benchmarks/felo_velo/recipes.py: which profile its Local-IID sweep chooses."""

from __future__ import annotations

from benchmarks.felo_velo import recipes

BALANCED = {"d0": [50] * 10, "d1": [50] * 10}


def record(cell, final, slope=0.1, predictions=None):
    return {
        "method": cell.method,
        "setting": cell.setting,
        "seed": cell.seed,
        "final_accuracy": final,
        "slope": slope,
        "wall_seconds": 1.0,
        "client_class_counts": BALANCED,
        "client_predictions": predictions or {"d0": [10] * 10, "d1": [10] * 10},
    }


def run(outcome, ran=lambda c: True):
    """The sweep's records: ``outcome(cell)`` for the cells ``ran`` keeps, None for the rest."""
    every = recipes.cells()
    return [record(c, *outcome(c)) if ran(c) else None for c in every], every


def test_the_cheapest_qualifying_candidate_is_chosen():
    accuracy = {"1600/dev": 0.78, "1 epoch": 0.77, "width 0.25": 0.80}
    records, every = run(lambda c: (accuracy.get(c.method, 0.72),))
    result = recipes.summarize(records, every)
    assert result["chosen"] == "1 epoch"  # cost 0.5 beats 1600/dev's 1 and width's 1.6
    assert not result["rows"]["current"]["qualifies"]  # the diagnosis is never chosen


def test_a_candidate_under_the_target_a_collapse_or_a_slope_does_not_qualify():
    def outcome(c):
        if c.method == "1 epoch":
            return (0.75,)  # under 76 %
        if c.method == "width 0.25" and c.seed == recipes.SEEDS[0]:
            return (0.9, 0.1, {"d0": [100] + [0] * 9, "d1": [10] * 10})  # d0 predicts one class
        if c.method == "width 0.25":
            return (0.9,)
        return (0.77, 0.6 if c.method == "1600/dev" else 0.1)  # 1600/dev still climbing
    records, every = run(outcome)
    result = recipes.summarize(records, every)
    assert result["chosen"] is None
    assert result["rows"]["width 0.25"]["collapsed"][recipes.SEEDS[0]]


def test_undecided_while_a_candidate_that_could_beat_it_has_seeds_to_run():
    accuracy = {"1600/dev": 0.78, "1 epoch": 0.71}
    first = [c for c in recipes.cells() if c.method in ("1600/dev", "1 epoch")]
    # every seed of 1600/dev, three of the cheaper 1 epoch: 1 epoch could still reach 76 %
    three = {c for c in first if c.method == "1600/dev" or c.seed in recipes.SEEDS[:3]}
    records, every = run(lambda c: (accuracy[c.method],), ran=three.__contains__)
    assert recipes.summarize(records, every)["chosen"] is None
    # all five of 1 epoch under the target: decided, width (dearer) and the diagnosis unrun
    records, every = run(lambda c: (accuracy[c.method],), ran=set(first).__contains__)
    result = recipes.summarize(records, every)
    assert result["chosen"] == "1600/dev" and result["not_run"]
    assert "1600/dev" in recipes.markdown({**result, "machine": {"before": {}, "after": {}},
                                           "commits": {}, "command": "x"})


def test_the_rounds_check_keeps_the_profile_but_its_rounds_and_chooses_the_cheapest():
    from benchmarks.felo_velo import rounds

    every = rounds.cells()
    assert [c.method for c in every[:5]] == ["8 rounds"] * 5  # cheapest first
    for c in every:  # the profile's Local-IID on the validation split: rounds and schedule alone
        changed = {k for k in c.config if c.config[k] != rounds.BASE.get(k)}
        assert changed == {"rounds", "lr_decay_rounds"}
    assert rounds.CANDIDATES["9 rounds"]["lr_decay_rounds"] == (4, 6)
    assert rounds.CANDIDATES["8 rounds"]["lr_decay_rounds"] == (3, 6)

    def records(accuracy, ran=lambda c: True):
        return [record(c, accuracy[c.method]) if ran(c) else None for c in every]

    both = {"8 rounds": 0.765, "9 rounds": 0.77}
    assert rounds.summarize(records(both), every)["chosen"] == "8 rounds"
    # 8 rounds under the target: 9 rounds is chosen once its seeds have run, not before
    short = {"8 rounds": 0.75, "9 rounds": 0.77}
    eight = records(short, lambda c: c.method == "8 rounds")
    assert rounds.summarize(eight, every)["chosen"] is None
    assert rounds.summarize(records(short), every)["chosen"] == "9 rounds"
    assert rounds.summarize(records({"8 rounds": 0.75, "9 rounds": 0.755}), every)["chosen"] is None
    page = rounds.markdown({**rounds.summarize(records(both), every), "commits": {},
                            "machine": {"before": {}, "after": {}}, "command": "x"})
    assert "Chosen: 8 rounds" in page and "validation split" in page
