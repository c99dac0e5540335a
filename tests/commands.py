"""The command lines the live tests start: the edgefl CLI in a subprocess, the server of a fleet,
and the small synthetic run they share (600 synthetic images, CNN width 0.25, a few steps of 16)."""

from __future__ import annotations

import sys
from pathlib import Path

#: The CLI as a subprocess of this interpreter.
EDGEFL = [sys.executable, "-m", "edgefl.cli.main"]


#: A server's run of one round of FedAvg with one device at least, on synthetic data, over CNN
#: tiers 1 and 2 at width 0.25.
ONE_ROUND_TWO_TIERS = ["--algorithm", "fedavg", "--rounds", "1", "--min-devices", "1",
                       "--dataset", "synthetic", "--model", "cnn", "--tiers", "1,2",
                       "--width", "0.25"]


def server_start(broker_url: str, fleet: str, *flags: str) -> list[str]:
    """``edgefl server start`` for ``fleet`` on the broker at ``broker_url``, with ``flags``."""
    return [*EDGEFL, "server", "start", "--broker", broker_url, "--fleet", fleet, *flags]


def tiny_run(out: Path, run_name: str, *, steps: int = 3) -> list[str]:
    """The flags of a small synthetic run (``steps`` minibatches of 16 a round) written to
    ``out/run_name``."""
    return ["--dataset", "synthetic", "--train-samples", "600", "--width", "0.25",
            "--steps", str(steps), "--batch-size", "16", "--out", str(out), "--run-name", run_name]


def run_main(args: list[str], monkeypatch, capsys) -> tuple[int | str | None, str, str]:
    """``edgefl args`` through main() (the console script) in this process, to see its exit code
    and its one-line errors: (exit code, stdout, stderr)."""
    import pytest

    from edgefl.cli.main import main

    monkeypatch.setattr("sys.argv", ["edgefl", *args])
    with pytest.raises(SystemExit) as exc:
        main()
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def device_agent(broker_url: str, fleet: str, device_id: str, models_dir: Path) -> list[str]:
    """``edgefl device agent``: device ``device_id`` of ``fleet`` keeping its models in
    ``models_dir``."""
    return [*EDGEFL, "device", "agent", "--broker", broker_url, "--fleet", fleet,
            "--device-id", device_id, "--models-dir", str(models_dir)]


def flags(**settings) -> list[str]:
    """``--name value`` for each setting, in order (underscores as dashes; True: the bare flag,
    None or False: left out)."""
    out: list[str] = []
    for name, value in settings.items():
        if value is None or value is False:
            continue
        out.append("--" + name.replace("_", "-"))
        if value is not True:
            out.append(str(value))
    return out


def simulated_tier(cfg, index: int) -> str:
    """The tier of device ``index`` of run ``cfg`` as the simulator gives it: the run's tiers (its
    model family's by default) in turn."""
    from edgefl.models import family_tiers

    tiers = list(cfg.tiers) if cfg.tiers else family_tiers(cfg.model)
    return tiers[index % len(tiers)]


def fleet_devices(cfg, url, fleet: str, folder: Path, extra=None, **options) -> dict:
    """The devices of run ``cfg`` (d00, d01, …) as ``edgefl train`` processes of ``fleet``, by
    :func:`edgefl.runtime.fleet.device_command`: each with its shard of the run's data, the run's
    tiers in turn, the simulated profile, its broker URL ``url(device_id)``, ``options`` (delay,
    verbose …) and the flags ``extra(device_id)``; their logs ``folder/<device id>.log``."""
    import json

    from edgefl.runtime.fleet import SIMULATED_PROFILE, data_spec_for, device_command, start_device

    profile = folder / "profile.json"
    profile.write_text(json.dumps(SIMULATED_PROFILE))
    devices = {}
    for i in range(cfg.clients):
        d = f"d{i:02d}"
        command = device_command(url(d), fleet, d, data_spec_for(cfg, i),
                                 tier=simulated_tier(cfg, i), profile_file=profile, **options)
        devices[d] = start_device(command + (extra(d) if extra else []), folder / f"{d}.log")
    return devices


def dashboard(*source: str):
    """``edgefl dashboard`` of ``source`` (``--run DIR``, or ``--broker URL --fleet NAME``) on a
    free port behind the web password ``s3cret``, its stderr a text pipe whose first line names
    the page."""
    import subprocess

    command = [*EDGEFL, "dashboard", *source, "--port", "0", "--web-password", "s3cret"]
    return subprocess.Popen(command, stderr=subprocess.PIPE, text=True)


def dashboard_url(dash) -> str:
    """The page's address, from the first line of :func:`dashboard`'s process (which must say
    it)."""
    import re

    line = dash.stderr.readline()
    match = re.search(r"http://127\.0\.0\.1:\d+/", line)
    assert match, f"the dashboard did not start: {line}"
    return match.group(0)


def dashboard_page(browser, **context):
    """A new page of ``browser`` logged in to :func:`dashboard` (its web password), with the
    browser context's ``context`` options."""
    login = {"username": "ops", "password": "s3cret"}
    return browser.new_context(http_credentials=login, **context).new_page()


def stop(*procs, grace: float = 20) -> None:
    """End the processes a test started that still run: SIGTERM, and SIGKILL after ``grace``
    seconds (scaled by the machine's speed)."""
    import subprocess

    from tests.conftest import scaled

    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(scaled(grace))
            except subprocess.TimeoutExpired:  # (not the test's subject: what failed before is)
                proc.kill()
                proc.wait(10)


def kill(*procs) -> None:
    """SIGKILL the processes a test started that still run (devices nobody waits for)."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def run_ok(*args: str, timeout: float = 300):
    """``edgefl args`` in a subprocess, which must succeed (its stderr says why not); the
    timeout is scaled by the machine's measured speed."""
    import subprocess

    from tests.conftest import scaled

    done = subprocess.run([*EDGEFL, *args], capture_output=True, text=True, timeout=scaled(timeout))
    assert done.returncode == 0, done.stderr
    return done
