import logging
import os

import pytest

try:  # tests/base run in a venv of the base install, without torch
    import torch
except ModuleNotFoundError:
    torch = None
else:
    torch.set_num_threads(2)


def pytest_collection_modifyitems(items):
    # tests/base need only the base install; CI also runs them alone on Python 3.10 without torch
    for item in items:
        if "tests/base/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.base)


@pytest.fixture(autouse=True)
def _quiet_logs(caplog):
    caplog.set_level(logging.WARNING)


def tiny_config(tmp_path, **overrides):
    """A run on the synthetic dataset that takes a second or two."""
    from edgefl.algorithms import get_algorithm
    from edgefl.config import resolve_config

    explicit = {
        "dataset": "synthetic",
        "clients": 3,
        "rounds": 2,
        "train_samples": 600,
        "test_samples": 200,
        "eval_samples": 100,
        "steps": 3,
        "batch_size": 16,
        "out_dir": str(tmp_path),
        "run_name": "run",
        "min_size": 5,
        **overrides,
    }
    algo = get_algorithm(explicit.get("algorithm", "fedavg"))
    defaults = dict(algo.defaults)
    if defaults.get("width", 1.0) > 0.25 or "width" not in defaults:
        explicit.setdefault("width", 0.25)
    return resolve_config(explicit, defaults)
