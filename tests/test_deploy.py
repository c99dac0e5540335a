"""deploy/: the systemd units verify with ``systemd-analyze verify`` and carry the restart policy,
environment file, dedicated user and hardening the deployment guide relies on."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
UNITS = ("edgefl-device.service", "edgefl-server.service", "edgefl-mosquitto.service")
HARDENING = {
    "NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
    "PrivateDevices": "yes", "ProtectKernelTunables": "yes", "ProtectControlGroups": "yes",
    "RestrictSUIDSGID": "yes", "CapabilityBoundingSet": "",
}  # fmt: skip


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """Sections → key → values (systemd allows a key more than once)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{path.name}: {line!r} before any section"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: {line!r} is not key=value"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


@pytest.mark.parametrize("name", UNITS)
def test_each_unit_restarts_on_failure_runs_as_its_own_user_and_is_hardened(name):
    unit = parse_unit(DEPLOY / name)
    service = unit["Service"]
    assert service["Restart"] == ["on-failure"] and float(service["RestartSec"][0]) > 0
    assert service["User"][0] in ("edgefl", "mosquitto") and service["User"][0] != "root"
    for key, value in HARDENING.items():
        assert service.get(key) == [value], f"{name}: {key}={service.get(key)}"
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]
    assert "network-online.target" in unit["Unit"]["After"][0]


def test_the_device_and_server_read_an_environment_file_and_skip_restarts_that_cannot_help():
    for name in ("edgefl-device.service", "edgefl-server.service"):
        service = parse_unit(DEPLOY / name)["Service"]
        assert service["EnvironmentFile"][0].lstrip("-").startswith("/etc/edgefl/")
        prevented = set(service["RestartPreventExitStatus"][0].split())
        # 4: broker down, worth a retry
        assert {"2", "3", "5", "7"} <= prevented and "4" not in prevented
        assert service["SuccessExitStatus"] == ["130"]  # edgefl's code for SIGTERM


def test_the_dedicated_user_is_declared_for_systemd_sysusers():
    line = next(
        x for x in (DEPLOY / "edgefl.sysusers.conf").read_text().splitlines() if x.startswith("u ")
    )
    assert line.split()[1] == "edgefl" and "nologin" in line


def _verify(root: Path, units: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["systemd-analyze", "verify", f"--root={root}", "--man=no", *units],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def fake_root(tmp_path):
    """A root with the system's own units and stand-ins for the programs the units start."""
    if shutil.which("systemd-analyze") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("systemd-analyze is not installed (CI installs Debian's systemd package)")
        pytest.skip("systemd-analyze is not installed")
    shutil.copytree("/usr/lib/systemd/system", tmp_path / "usr/lib/systemd/system", symlinks=True)
    for program in ("opt/edgefl/venv/bin/edgefl", "bin/sh", "bin/kill", "usr/sbin/mosquitto"):
        path = tmp_path / program
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    (tmp_path / "etc/systemd/system").mkdir(parents=True)
    for name in UNITS:
        shutil.copy(DEPLOY / name, tmp_path / "etc/systemd/system" / name)
    return tmp_path


def test_systemd_analyze_verify_finds_nothing_to_say_about_the_units(fake_root):
    result = _verify(fake_root, list(UNITS))
    complaints = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if "edgefl" in line or "mosquitto" in line
    ]
    assert result.returncode == 0 and complaints == []


def test_systemd_analyze_verify_would_catch_a_broken_unit(fake_root):
    unit = fake_root / "etc/systemd/system/edgefl-device.service"
    unit.write_text(
        unit.read_text()
        .replace("Type=exec", "Type=exce")
        .replace("ProtectSystem=strict", "ProtectSytem=strict")
    )
    result = _verify(fake_root, ["edgefl-device.service"])
    said = result.stdout + result.stderr
    assert "exce" in said and "ProtectSytem" in said
