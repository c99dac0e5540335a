"""Tests of the base install (no torch). CI runs this folder alone on Python 3.10 in a venv with
only ``pip install .``; under the full install they run with the rest of the suite, and their
commands run in subprocesses where torch and the other optional layers cannot be imported."""

import os

import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/base/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.base)
