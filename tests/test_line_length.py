"""Lines of at most 100 columns everywhere (issue #38): ruff's E501 over the library, the tests
and the benchmarks, with the project's own ruff settings (pyproject.toml: line-length = 100)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_no_line_is_longer_than_100_columns():
    pytest.importorskip("ruff")
    found = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--select", "E501",
         "--output-format", "concise", "edgefl", "tests", "benchmarks"],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert found.returncode == 0, found.stdout + found.stderr
