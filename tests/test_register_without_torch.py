"""``edgefl device register`` on a device without torch (the base install) against a real server."""

import json
import os
import subprocess

import pytest

from edgefl.runtime.fleet import SIMULATED_PROFILE
from edgefl.transport.broker import EmbeddedBroker
from tests.base.helpers import run_edgefl
from tests.commands import ONE_ROUND_TWO_TIERS, server_start

pytestmark = pytest.mark.slow


def test_register_without_torch_prints_the_assigned_model(tmp_path):
    broker = EmbeddedBroker(port=0).start()
    server = subprocess.Popen(
        server_start(broker.url, "base", *ONE_ROUND_TWO_TIERS, "--wait", "90",
                     "--out", str(tmp_path / "runs"), "--run-name", "r"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(SIMULATED_PROFILE))
    try:
        result = run_edgefl(
            "device",
            "register",
            "--broker",
            broker.url,
            "--fleet",
            "base",
            "--device-id",
            "pi-1",
            "--tier",
            "2",
            "--profile",
            str(profile),
            "--timeout",
            "60",
            "--json",
        )
    finally:
        server.kill()
        server.wait(10)
        broker.stop()
    assert result.returncode == 0, result.stderr
    assignment = json.loads(result.stdout)
    assert json.loads(assignment["spec"])["tier"] == "2" and assignment["algorithm"] == "fedavg"
    assert assignment["rounds"] == 1
