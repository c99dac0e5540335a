"""A committed cell is found again by its key: a setting added to the run configuration with a
default (``RunConfig``) must not change the key of every run made before it existed
(``edgefl.config.ADDED_SETTINGS``), or every benchmark would rerun its whole grid and its
committed results would no longer be read back."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["foundation", "time_to_accuracy"])
def test_every_declared_cell_of_a_committed_benchmark_is_in_its_cache(name):
    bench = importlib.import_module(f"benchmarks.{name}").make(False)
    files = {p.name.split("-")[0] for p in (ROOT / "benchmarks" / name / "cells").glob("*.json")}
    missing = [(c.method, c.setting, c.seed) for c in bench.all_cells() if c.key not in files]
    assert not missing, (
        f"cells whose key no committed file has (a new RunConfig setting?): {missing}"
    )
