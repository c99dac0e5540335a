"""``edgefl train`` exits with the code of the cause when a real broker or server says no:
5 when the broker refuses the credentials, 6 when the server rejects the device."""

import json
import os
import subprocess
import sys

import pytest

from edgefl.runtime.fleet import SIMULATED_PROFILE
from edgefl.transport.accounts import add_user
from edgefl.transport.broker import EmbeddedBroker, MosquittoBroker
from tests.commands import ONE_ROUND_TWO_TIERS, server_start
from tests.needs import need_mosquitto

pytestmark = pytest.mark.slow


def _env():
    return {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def _train(*args, tmp_path, timeout=120):
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(SIMULATED_PROFILE))
    cmd = [
        sys.executable,
        "-m",
        "edgefl.cli.main",
        "train",
        "--profile",
        str(profile),
        "--data",
        "synthetic",
        "--threads",
        "1",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env())


def test_a_refused_password_exits_5_without_retrying(tmp_path):
    need_mosquitto()
    passwd, acl = tmp_path / "passwd", tmp_path / "acl"
    add_user(passwd, acl, "dev-a")
    with MosquittoBroker(
        port=0, password_file=passwd, acl_file=acl, workdir=tmp_path / "mosq"
    ) as broker:
        result = _train(
            "--broker",
            broker.url,
            "--fleet",
            "lab",
            "--device-id",
            "dev-a",
            "--username",
            "dev-a",
            "--password",
            "wrong",
            "--wait",
            "30",
            tmp_path=tmp_path,
        )
    assert result.returncode == 5, result.stdout + result.stderr
    assert "refused" in result.stderr and "Traceback" not in result.stderr
    assert "wrong" not in result.stdout + result.stderr  # the password is never printed


def test_a_tier_the_run_does_not_have_is_rejected_by_the_server_and_exits_6(tmp_path):
    broker = EmbeddedBroker(port=0).start()
    server_cmd = server_start(broker.url, "rej", *ONE_ROUND_TWO_TIERS, "--wait", "60",
                              "--out", str(tmp_path / "runs"), "--run-name", "r")
    server = subprocess.Popen(
        server_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env()
    )
    try:
        result = _train(
            "--broker",
            broker.url,
            "--fleet",
            "rej",
            "--device-id",
            "d00",
            "--tier",
            "9",
            "--wait",
            "30",
            tmp_path=tmp_path,
        )
    finally:
        server.kill()
        server.wait(10)
        broker.stop()
    assert result.returncode == 6, result.stdout + result.stderr
    assert "refused device d00" in result.stderr and "tier '9'" in result.stderr
