"""The two sweeps of Local's recipe in the privacy benchmark (benchmarks/privacy/local_recipe*.py):
each applies its own rule, fixed in its docstring before its cells ran."""

from __future__ import annotations

from benchmarks.privacy import local_recipe, local_recipe_dir05


def fake(cell, acc, slope, cpu=10.0):
    return {"method": cell.method, "seed": cell.seed, "final_accuracy": acc, "slope": slope,
            "cpu_seconds": cpu, "wall_seconds": cpu, "client_accuracy": {"d0": acc},
            "config": cell.full_config()}


def test_dir05_reads_convergence_as_the_mean_slope_under_0_4_and_picks_the_best_converged():
    # Prepare: the grid's recipe too steep on average; e2 converged but weaker; e4 converged and
    # best, though one of its seeds is steeper than 0.5 (the mean is what the rule reads)
    spec = local_recipe_dir05.SPEC
    every = spec.cells()
    shape = {"e1 b32 lr0.05": (0.50, [0.6, 0.7, 0.2, 0.5, 0.4]),
             "e2 b32 lr0.05": (0.51, [0.3, 0.3, 0.3, 0.3, 0.3]),
             "e4 b32 lr0.05": (0.52, [0.6, 0.2, 0.3, 0.3, 0.3])}
    records = [fake(c, shape[c.method][0], shape[c.method][1][spec.seeds.index(c.seed)],
                    cpu=10.0 * int(c.method[1])) for c in every]
    # Execute
    result = local_recipe.summarize(records, every, spec)
    # Assert
    assert result["status"] == {"e1 b32 lr0.05": "not converged",
                                "e2 b32 lr0.05": "stable, converged",
                                "e4 b32 lr0.05": "stable, converged"}
    assert result["chosen"] == "e4 b32 lr0.05"
    assert result["chosen_recipe"] == {"epochs": 4, "batch_size": 32, "lr": 0.05}


def test_dir05_refuses_a_candidate_past_its_cost_limit_and_the_fleet_sweep_keeps_every_run():
    spec = local_recipe_dir05.SPEC
    every = spec.cells()
    records = [fake(c, 0.5, 0.1, cpu=10.0 * (5 if c.method.startswith("e4") else 1))
               for c in every]
    assert local_recipe.summarize(records, every, spec)["status"]["e4 b32 lr0.05"] == (
        "ineligible (cost)")
    # the 1,000-device sweep: one run at 0.5 or more leaves its candidate not converged
    fleet = local_recipe.FLEET
    cells = fleet.cells()
    records = [fake(c, 0.4, 0.6 if c.seed == 11 else 0.1) for c in cells]
    assert set(local_recipe.summarize(records, cells, fleet)["status"].values()) == {
        "not converged"}
