"""Argument and configuration mistakes are reported before torch is imported: the command runs
with an import guard that ends the process (exit 99) the moment anything imports torch."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

GUARD = """
import importlib.abc, os, sys
class _NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch":
            sys.stderr.write("TORCH IMPORTED\\n"); sys.stderr.flush(); os._exit(99)
sys.meta_path.insert(0, _NoTorch())
from edgefl.cli.main import main; sys.argv[0] = "edgefl"; main()
"""


def run_guarded(*args: str, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EDGEFL_BROKER": "", "EDGEFL_CONFIG": ""}
    env = {k: v for k, v in env.items() if v != ""}
    return subprocess.run(
        [sys.executable, "-c", GUARD, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=cwd,
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("simulate", "--algorithm", "nope"), "unknown algorithm 'nope'; choose one of: fedavg"),
        (("simulate", "--model", "nope"), "unknown model family 'nope'"),
        (("simulate", "--dataset", "nope"), "unknown dataset 'nope'"),
        (("simulate", "--partition", "nope"), "partition"),
        (("simulate", "--rounds", "0"), "rounds must be >= 1"),
        (("simulate", "--transport", "pigeon"), "--transport must be memory or mqtt"),
        (("server", "start", "--algorithm", "nope"), "unknown algorithm 'nope'"),
        (("server", "start", "--dataset", "imagefolderx:/tmp"), "unknown dataset"),
        (
            ("train", "--device-id", "pi-1", "--data", "nope:shard=1/2"),
            "unknown dataset 'nope:shard=1/2'",
        ),
    ],
)
def test_a_mistake_is_reported_without_importing_torch(args, says):
    result = run_guarded(*args)
    assert "TORCH IMPORTED" not in result.stderr
    assert result.returncode == 3, result.stderr
    assert says in result.stderr and "Traceback" not in result.stderr


def test_a_config_file_mistake_is_reported_without_importing_torch(tmp_path):
    (tmp_path / "run.toml").write_text('algorithm = "velo"\nclients = 4\nmin_devices = 9\n')
    result = run_guarded("simulate", "--config", str(tmp_path / "run.toml"))
    assert "TORCH IMPORTED" not in result.stderr and result.returncode == 3, result.stderr
    assert "min_devices (9) exceeds clients (4)" in result.stderr


def test_the_guard_catches_a_command_that_does_import_torch():
    # the check above could not fail if the guard never fired
    result = run_guarded(
        "simulate", "--algorithm", "fedavg", "--dataset", "synthetic", "--rounds", "1"
    )
    assert result.returncode == 99 and "TORCH IMPORTED" in result.stderr


def test_help_lists_the_registries_choices():
    from edgefl.algorithms import algorithm_names
    from edgefl.data import dataset_names
    from edgefl.models import family_names

    for command in (("simulate",), ("server", "start")):
        text = " ".join(run_guarded(*command, "--help").stdout.split())
        for name in (
            algorithm_names() + family_names() + [d for d in dataset_names() if d != "imagefolder"]
        ):
            assert name in text, (command, name)
        assert "imagefolder:DIR" in text
