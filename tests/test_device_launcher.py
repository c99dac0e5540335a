"""The fleet's device launcher: processes forked from a preloaded fork server behave as exec'd ones
(exit code, log file, the launcher's current environment)."""

from __future__ import annotations

import sys

import pytest

from edgefl import __version__
from edgefl.cli.simulate import device_entry as entry
from edgefl.runtime.fleet import DeviceLauncher, DeviceProcess

CLI = [sys.executable, "-m", "edgefl.cli.main"]


@pytest.mark.parametrize("forked", [True, False])
def test_a_launched_process_runs_the_cli_into_its_log_with_its_exit_code(tmp_path, forked):
    launcher = DeviceLauncher(entry if forked else None)
    assert launcher.launch == ("fork" if forked else "exec")
    ok = launcher.start([*CLI, "--version"], tmp_path / "ok.log")
    bad = launcher.start([*CLI, "train", "--no-such-option"], tmp_path / "bad.log")
    assert isinstance(ok, DeviceProcess) == forked  # forked, not exec'd behind the launcher's back
    assert ok.wait(timeout=60) == 0
    assert bad.wait(timeout=60) == 2  # a usage error, as from the shell
    assert (tmp_path / "ok.log").read_text().strip() == f"edgefl {__version__}"
    assert "--no-such-option" in (tmp_path / "bad.log").read_text()


def test_forked_processes_see_the_environment_of_when_they_were_started(tmp_path, monkeypatch):
    launcher = DeviceLauncher(entry)
    assert launcher.launch == "fork"  # Linux has fork servers
    # the fork server is up
    launcher.start([*CLI, "--version"], tmp_path / "warm.log").wait(timeout=60)
    monkeypatch.setenv("EDGEFL_CONFIG", str(tmp_path / "missing.toml"))  # set after it started
    p = launcher.start([*CLI, "train"], tmp_path / "env.log")
    assert p.wait(timeout=60) == 3  # a configuration error: the file named by the new variable
    assert "missing.toml" in (tmp_path / "env.log").read_text()
