"""The records and cells that tests/test_bench_runner.py and tests/test_bench_claims.py share: a
run's record, a tiny synthetic cell, a full run of cells, a gated report."""

from __future__ import annotations

from benchmarks.runner import Cell


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
