"""docs/deployment.md §1 as written: the broker commands make the files, and `mosquitto -c
broker/...` started by whoever runs the tests (as root: Mosquitto drops to the `mosquitto` user
before it opens them) loads them, accepts a client and writes its persistence. Only the listener's
port is changed."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from edgefl.transport.broker import free_port, mosquitto_binary, wait_for_port
from edgefl.transport.mqtt import BrokerAddress
from edgefl.transport.mqtt.connection import check_tls, detect_protocol
from tests.conftest import wait_until
from tests.test_broker_acl import client

ROOT = Path(__file__).resolve().parents[1]


def _edgefl(cwd: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "edgefl.cli.main", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr, done.stderr
    return done.stdout


@pytest.fixture
def repo():
    """A copy of the repository's broker/ where the mosquitto user can reach it (pytest's own
    temporary directories are 0700 to root)."""
    if mosquitto_binary() is None:
        pytest.skip("mosquitto is not installed")
    d = Path(tempfile.mkdtemp(prefix="edgefl-broker-docs-", dir="/tmp"))
    d.chmod(0o755)
    shutil.copytree(ROOT / "broker", d / "broker")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _run_mosquitto(repo: Path, conf: str, listener: str):
    port = free_port()
    path = repo / "broker" / conf
    text = path.read_text()
    assert listener in text
    path.write_text(text.replace(listener, f"listener {port} 127.0.0.1"))
    log = open(repo / "mosquitto.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [mosquitto_binary(), "-c", f"broker/{conf}"], cwd=repo, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        wait_for_port("127.0.0.1", port, timeout=15)
    except Exception:
        proc.kill()
        proc.wait(10)
        log.close()
        pytest.fail(
            f"mosquitto did not start: {(repo / 'mosquitto.log').read_text(errors='replace')}"
        )
    return proc, port, log


def _stop(proc, log, repo: Path) -> str:
    proc.terminate()
    proc.wait(15)
    log.close()
    return (repo / "mosquitto.log").read_text(errors="replace")


def _accepted(port: int, user: str, password: str) -> bool:
    """Whether the broker accepts an MQTT session with these credentials."""
    c, state = client(SimpleNamespace(port=port), user, password)
    c.disconnect()
    c.loop_stop()
    return state["reason"] is not None and not state["reason"].is_failure


def test_mutual_tls_as_documented(repo):
    _edgefl(
        repo,
        "broker",
        "ca",
        "--certs",
        "broker/certs",
        "--fleet",
        "lab",
        "--host",
        "localhost",
        "--ip",
        "127.0.0.1",
    )
    _edgefl(
        repo,
        "broker",
        "add-device",
        "edgefl-server",
        "--fleet",
        "lab",
        "--role",
        "server",
        "--certs",
        "broker/certs",
    )
    _edgefl(repo, "broker", "add-device", "pi-07", "--fleet", "lab", "--certs", "broker/certs")
    proc, port, log = _run_mosquitto(repo, "mosquitto-tls.conf", "listener 8883 0.0.0.0")
    try:
        certs = repo / "broker" / "certs"
        address = BrokerAddress.parse(f"mqtts://127.0.0.1:{port}").with_tls(
            str(certs / "ca.crt"), str(certs / "pi-07.crt"), str(certs / "pi-07.key")
        )
        check_tls(address)  # raises when the broker refuses pi-07's certificate
        assert detect_protocol(address) == 5  # an MQTT session: CONNACK accepted
    finally:
        text = _stop(proc, log, repo)
    assert "Error" not in text and "Permission denied" not in text, text
    # persistence written (as the mosquitto user when root)
    assert (repo / "broker" / "data" / "mosquitto.db").is_file()


def test_passwords_as_documented(repo):
    server_password = _edgefl(
        repo, "broker", "add-device", "edgefl-server", "--fleet", "lab", "--role", "server"
    ).strip()
    _edgefl(repo, "broker", "add-device", "pi-07", "--fleet", "lab")
    proc, port, log = _run_mosquitto(repo, "mosquitto.conf", "listener 1883 0.0.0.0")
    try:
        address = BrokerAddress.parse(f"mqtt://edgefl-server:{server_password}@127.0.0.1:{port}")
        assert detect_protocol(address) == 5
        # a device added while the broker runs is let in once SIGHUP reloaded the password and ACL
        # files, as the docs say after add-device (waited for: the reload's own time varies)
        late = _edgefl(repo, "broker", "add-device", "pi-08", "--fleet", "lab").strip()
        assert not _accepted(port, "pi-08", late)
        proc.send_signal(1)
        wait_until(
            lambda: _accepted(port, "pi-08", late),
            "the reloaded broker to let pi-08 in",
            timeout=60,
        )
        assert proc.poll() is None
    finally:
        text = _stop(proc, log, repo)
    assert "Error" not in text and "Permission denied" not in text, text
    assert (repo / "broker" / "data" / "mosquitto.db").is_file()
