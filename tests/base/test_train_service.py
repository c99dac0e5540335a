"""``edgefl train`` as a service, before any torch is needed: it says at once which broker it
waits for, retries with backoff, exits with the documented code after --wait, and resolves its
settings from options > environment > TOML file."""

import subprocess
import time

from tests.base.helpers import ROOT, edgefl_command, env, run_edgefl, train_args
from tests.conftest import scaled


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


def _cli_start_seconds() -> float:
    """What starting the CLI and parsing train's options costs on this machine right now
    (``--print-config`` does that much and no more)."""
    t0 = time.monotonic()
    assert (
        run_edgefl("train", "--device-id", "d", "--data", "synthetic", "--print-config").returncode
        == 0
    )
    return time.monotonic() - t0


def test_no_broker_says_so_within_a_second_retries_and_exits_4_after_wait():
    port = _free_port()
    cmd = edgefl_command(*train_args(f"mqtt://127.0.0.1:{port}", 3))
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=ROOT
    )
    try:
        first = proc.stdout.readline()
        first_after = time.monotonic() - t0
        rest, err = proc.communicate(timeout=scaled(30))
    finally:
        if proc.poll() is None:
            proc.kill()
    total = time.monotonic() - t0
    assert f"waiting for broker mqtt://127.0.0.1:{port}" in first
    # 1 s on an idle machine; a machine shared by many jobs may need longer just to start Python
    # and parse the options, so the bound is then that time plus half a second (both stretched by
    # the speed factor: the load changes between the two runs): nothing heavy (paho, numpy, torch)
    # may come before the line
    bound = max(scaled(1.0), 1.5 * _cli_start_seconds() + scaled(0.5))
    assert first_after < bound, (
        f"the first line came after {first_after:.2f} s (bound {bound:.2f} s)"
    )
    retries = [line for line in rest.splitlines() if "unreachable" in line and "retry" in line]
    assert len(retries) == 2 and "retry 1 in 1.0 s" in retries[0]
    # the second delay doubles to 2 s, clipped to what is left of --wait 3 (less by the time the
    # attempts themselves took: 1.9 s on a loaded machine)
    second = float(retries[1].rsplit("retry 2 in ", 1)[1].split(" s")[0])
    assert 1.0 < second <= 2.0, retries[1]
    assert proc.returncode == 4
    assert "gave up after --wait 3 s" in err
    assert 3.0 <= total < 3.0 + scaled(7)


def test_a_bad_broker_url_is_a_configuration_error():
    result = run_edgefl(*train_args("http://x", 1))
    assert result.returncode == 3 and "scheme must be mqtt" in result.stderr


def test_a_missing_device_id_is_a_configuration_error():
    result = run_edgefl("train", "--data", "synthetic", "--wait", "1")
    assert result.returncode == 3 and "--device-id" in result.stderr


def test_an_unknown_option_is_a_usage_error():
    result = run_edgefl("train", "--no-such-option")
    assert result.returncode == 2


def test_settings_precedence_is_options_then_environment_then_file(tmp_path):
    (tmp_path / "pw").write_text("s3cret\n")
    config = tmp_path / "device.toml"
    config.write_text(
        '[device]\nbroker = "mqtt://from-file:1883"\nfleet = "file-fleet"\ndevice_id = "file-id"\n'
        f'data = "synthetic"\nusername = "file-user"\npassword_file = "{tmp_path / "pw"}"\nwait = '
        "30\n"
    )
    result = run_edgefl(
        "train", "--config", str(config), "--device-id", "option-id", "--print-config",
        extra_env={"EDGEFL_FLEET": "env-fleet", "EDGEFL_DEVICE_ID": "env-id", "EDGEFL_BROKER": ""},
    )
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(" = ", 1) for line in result.stdout.splitlines())
    assert lines["device_id"] == '"option-id"  # option'
    assert lines["fleet"] == '"env-fleet"  # env'
    assert lines["broker"].startswith('"mqtt://from-file:1883"  # file')
    assert lines["username"].startswith('"file-user"  # file')
    assert lines["wait"].startswith("30  # file")
    assert lines["password"].startswith('"***"  # password file') and "s3cret" not in result.stdout


def test_an_unknown_key_in_the_file_is_a_configuration_error(tmp_path):
    config = tmp_path / "device.toml"
    config.write_text('brokr = "mqtt://x"\n')
    result = run_edgefl("train", "--config", str(config), "--device-id", "d", "--data", "synthetic")
    assert result.returncode == 3 and "brokr" in result.stderr
