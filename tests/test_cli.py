"""The CLI as a user meets it: help, one-line errors, --json output."""

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from edgefl.cli.main import app, main
from tests.commands import flags, run_main

runner = CliRunner()


_run = run_main


def test_help_lists_commands():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0 and "simulate" in result.output


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--algorithm", "fedsgd"], "choose one of: fedavg"),
        (["--alpha", "0"], "alpha must be > 0"),
        (["--fraction", "1.5"], "fraction must be in (0, 1]"),
        (["--clients", "0"], "clients must be >= 1"),
        (["--model", "transformer"], "choose one of: cnn"),
        (["--dataset", "imagenet"], "unknown dataset 'imagenet'"),
        (["--dataset", "mnist", "--data-dir", "/nonexistent"], "train-images-idx3-ubyte"),
        (["-o", "mu"], "key=value"),
    ],
)
def test_bad_input_gives_one_clear_line_and_the_configuration_exit_code(
    monkeypatch, capsys, args, needle
):
    from edgefl.errors import ExitCode

    code, out, err = _run(["simulate", *args, "--quiet"], monkeypatch, capsys)
    assert code == ExitCode.CONFIG == 3
    assert needle in err
    assert "Traceback" not in err and err.strip().count("\n") <= 1


def test_debug_shows_the_traceback(monkeypatch, capsys):
    from edgefl.errors import ConfigError

    monkeypatch.setattr("sys.argv", ["edgefl", "--debug", "simulate", "--alpha", "0", "--quiet"])
    with pytest.raises(ConfigError):
        main()


def test_simulate_json_has_the_documented_keys(tmp_path, monkeypatch, capsys):
    args = ["simulate", *flags(dataset="synthetic", clients=2, rounds=2, train_samples=400,
                               test_samples=200, steps=2, width=0.25, out=tmp_path, run_name="r",
                               json=True, quiet=True)]
    code, out, _ = _run(args, monkeypatch, capsys)
    assert code == 0
    summary = json.loads(out)
    for key in ("algorithm", "rounds", "mean_accuracy", "tier_accuracy", "client_accuracy",
                "bytes_up_per_round", "bytes_down_per_round", "wall_seconds", "run_dir"):
        assert key in summary
    assert summary["algorithm"] == "fedavg" and summary["rounds"] == 2
    assert len(summary["bytes_up_per_round"]) == 2 and min(summary["bytes_up_per_round"]) > 0
    assert set(summary["client_accuracy"]) == {"d00", "d01"}
    assert (tmp_path / "r" / "rounds.jsonl").exists() and (tmp_path / "r" / "accuracy.png").exists()


def test_toml_config_is_read_and_flags_override_it(tmp_path, monkeypatch, capsys):
    cfg = tmp_path / "run.toml"
    cfg.write_text(
        'dataset = "synthetic"\nclients = 2\nrounds = 3\nsteps = 1\nwidth = 0.25\ntrain_samples = '
        "300\n"
        'test_samples = 100\n[options]\nmu = "0.1"\n'
    )
    args = ["simulate", *flags(config=cfg, algorithm="fedprox", rounds=1, out=tmp_path,
                               run_name="t", json=True, quiet=True)]
    code, out, _ = _run(args, monkeypatch, capsys)
    assert code == 0
    summary = json.loads(out)
    resolved = json.loads((tmp_path / "t" / "config.json").read_text())
    assert summary["rounds"] == 1 and resolved["clients"] == 2
    assert resolved["resolved_options"] == {
        "mu": 0.1,
        "aggregator": "mean",
        "trim": 0.2,
        "clip_norm": 0.0,
    }


def test_lr_decay_rounds_flag_reaches_the_run_config(tmp_path, monkeypatch, capsys):
    args = ["simulate", *flags(dataset="synthetic", clients=2, rounds=1, train_samples=300,
                               test_samples=100, steps=1, width=0.25, lr_decay_rounds="4,7",
                               out=tmp_path, run_name="d", json=True, quiet=True)]
    code, _, _ = _run(args, monkeypatch, capsys)
    assert code == 0
    assert json.loads((tmp_path / "d" / "config.json").read_text())["lr_decay_rounds"] == [4, 7]
    from edgefl.errors import ExitCode

    code, _, err = _run(["simulate", "--lr-decay-rounds", "four", "--quiet"], monkeypatch, capsys)
    assert code == ExitCode.USAGE and "--lr-decay-rounds 'four'" in err


@pytest.mark.parametrize(("given", "expected"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_the_command_lets_torchs_threads_sleep_unless_told_otherwise(given, expected):
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given is not None:
        env["OMP_WAIT_POLICY"] = given
    code = (
        "import os, sys, edgefl.cli.main; print(os.environ['OMP_WAIT_POLICY'], 'torch' in "
        "sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == [expected, "False"]  # set before torch (which reads it when it loads) is imported
