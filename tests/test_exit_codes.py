"""Every command exits by cause (edgefl.errors.ExitCode, the table in docs/deployment.md), with one
clear line: real commands in subprocesses against a real Mosquitto (plain and mutual TLS) and
the embedded broker; no mocks."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgefl.errors import ExitCode
from edgefl.transport.accounts import mosquitto_user
from edgefl.transport.broker import EmbeddedBroker, MosquittoBroker, free_port
from tests.commands import device_agent
from tests.conftest import scaled
from tests.needs import need_mosquitto

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "tests" / "base" / "synthetic-cnn.onnx"
CLEAN = (
    "EDGEFL_BROKER",
    "EDGEFL_FLEET",
    "EDGEFL_CONFIG",
    "EDGEFL_PASSWORD",
    "EDGEFL_MQTT_PASSWORD",
    "EDGEFL_PASSWORD_FILE",
    "EDGEFL_CA_FILE",
    "EDGEFL_CERT_FILE",
    "EDGEFL_KEY_FILE",
    "EDGEFL_DEVICE_ID",
    "EDGEFL_USERNAME",
    "EDGEFL_MODELS_DIR",
)


def env(**extra) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in CLEAN}
    return {
        **base,
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        **extra,
    }


def edgefl(*args, cwd=None, timeout=120, **extra) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "edgefl.cli.main", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env=env(**extra),
    )


def one_line_error(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


# --- infer ----------------------------------------------------------------------------------------

def test_infer_a_missing_or_corrupt_model_is_a_configuration_error(tmp_path):
    (tmp_path / "corrupt.onnx").write_bytes(MODEL.read_bytes()[:200])
    for model, says in (
        (tmp_path / "missing.onnx", "no ONNX model file at"),
        (tmp_path / "corrupt.onnx", "is not a valid ONNX model"),
    ):
        result = edgefl("infer", model, "--dataset", "synthetic")
        assert result.returncode == ExitCode.CONFIG, result.stderr
        assert says in one_line_error(result)
    # nothing deployed there
    result = edgefl("infer", "--models-dir", tmp_path / "store", "--dataset", "synthetic")
    assert result.returncode == ExitCode.CONFIG and "no model is installed" in one_line_error(
        result
    )


def test_infer_a_photo_of_another_size_says_how_in_the_clis_words(tmp_path):
    from PIL import Image

    Image.new("L", (300, 300), 128).save(tmp_path / "photo.png")
    result = edgefl("infer", MODEL, tmp_path / "photo.png")
    line = one_line_error(result)
    assert result.returncode == ExitCode.CONFIG
    assert "300×300 pixels" in line and "--resize" in line and "resize=True" not in line
    assert edgefl("infer", MODEL, tmp_path / "photo.png", "--resize").returncode == 0


def test_infer_skips_folders_the_model_does_not_know_only_when_asked(tmp_path):
    from PIL import Image

    for folder in ("pattern_0", "Pattern-1", "cats"):  # two spell the model's classes otherwise
        (tmp_path / "pics" / folder).mkdir(parents=True)
        for i in range(3):
            Image.new("L", (28, 28), 40 * i).save(tmp_path / "pics" / folder / f"{i}.png")
    refused = edgefl("infer", MODEL, "--dataset", f"imagefolder:{tmp_path / 'pics'}")
    line = one_line_error(refused)
    assert refused.returncode == ExitCode.CONFIG
    assert (
        "cats" in line and "--class-map FOLDER=CLASS" in line and "--skip-unknown-classes" in line
    )
    done = edgefl(
        "infer",
        MODEL,
        "--dataset",
        f"imagefolder:{tmp_path / 'pics'}",
        "--skip-unknown-classes",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (
        result["samples"] == 6
        and result["skipped_classes"] == ["cats"]
        and result["skipped_samples"] == 3
    )
    assert result["class_map"] == {"Pattern-1": "pattern-1", "pattern_0": "pattern-0"}


def test_a_folder_can_name_every_fashion_mnist_class_by_its_slug():
    from edgefl.data.sources import dataset_info
    from edgefl.inference import class_index_map

    classes = dataset_info("fashion-mnist").class_names  # "T-shirt/top" cannot be a folder name
    folders = [
        "t-shirt-top" if c == "T-shirt/top" else c.lower().replace(" ", "-") for c in classes
    ]
    index, matched = class_index_map(sorted(folders), classes)
    assert matched["t-shirt-top"] == "T-shirt/top" and sorted(matched.values()) == sorted(classes)
    assert [classes[i] for i in index] == [matched[f] for f in sorted(folders)]


# --- server start and train: an unreachable broker, and TLS refusals ------------------------------

def test_server_start_retries_an_unreachable_broker_then_exits_4():
    port = free_port()
    result = edgefl(
        "server",
        "start",
        "--broker",
        f"mqtt://127.0.0.1:{port}",
        "--broker-wait",
        "2",
        "--dataset",
        "synthetic",
    )
    assert result.returncode == ExitCode.BROKER_UNREACHABLE, result.stderr
    assert (
        f"waiting for broker mqtt://127.0.0.1:{port}" in result.stderr
        and "retry 1 in" in result.stderr
    )
    assert "gave up after --broker-wait 2 s" in one_line_error(result)


def test_commands_that_read_the_fleet_exit_4_for_an_unreachable_broker_and_3_for_a_missing_run(
    tmp_path,
):
    port = free_port()
    result = edgefl("fleet", "status", "--broker", f"mqtt://127.0.0.1:{port}", "--timeout", "2")
    assert (
        result.returncode == ExitCode.BROKER_UNREACHABLE
        and "cannot reach the broker" in one_line_error(result)
    )
    result = edgefl("fleet", "status", "--run", tmp_path / "nope")
    assert result.returncode == ExitCode.CONFIG and "holds no status.json" in one_line_error(result)
    result = edgefl("export", "--run", tmp_path / "nope", "--all", "--out", tmp_path / "onnx")
    assert result.returncode == ExitCode.CONFIG and "is not a run directory" in one_line_error(
        result
    )


def test_server_start_reads_its_password_file_and_names_it_when_unreadable(tmp_path):
    result = edgefl(
        "server", "start", "--dataset", "synthetic", EDGEFL_PASSWORD_FILE=str(tmp_path / "nope")
    )
    assert result.returncode == ExitCode.CONFIG
    assert f"cannot read the password file {tmp_path / 'nope'} (--password-file)" in one_line_error(
        result
    )


@pytest.fixture(scope="module")
def tls_fleet(tmp_path_factory):
    """A mutual-TLS Mosquitto made with the CLI's own files, and a second CA that signed nothing it
    trusts."""
    need_mosquitto()
    d = tmp_path_factory.mktemp("tls")
    for command in (  # as an operator types them, in d
        "broker ca --certs certs --fleet lab",
        "broker add-device pi-07 --fleet lab --certs certs --acl-file acl",
        "broker add-device edgefl-server --role server --fleet lab --certs certs --acl-file acl",
        "broker ca --certs other --fleet else",
        "broker add-device pi-07 --fleet lab --certs other --acl-file other-acl",
    ):
        done = edgefl(*command.split(), cwd=d)
        assert done.returncode == 0, done.stderr
    broker = MosquittoBroker(
        tls=(d / "certs" / "ca.crt", d / "certs" / "broker.crt", d / "certs" / "broker.key"),
        acl_file=d / "acl",
        workdir=d / "mosquitto",
    ).start()
    yield d, f"mqtts://127.0.0.1:{broker.tls_port}"
    broker.stop()


def train_pi07(url, *flags) -> tuple:
    """``edgefl train`` as device pi-07 of the fleet at ``url`` on synthetic data, waiting 8 s
    for the broker at most, with ``flags``."""
    return ("train", "--broker", url, "--device-id", "pi-07", "--data", "synthetic", "--wait", "8",
            *flags)


def test_a_missing_client_certificate_is_one_line_naming_the_options_and_exits_5(tls_fleet):
    d, url = tls_fleet
    ca = d / "certs" / "ca.crt"
    commands = (
        train_pi07(url, "--ca-file", ca),
        (
            "server",
            "start",
            "--broker",
            url,
            "--fleet",
            "lab",
            "--dataset",
            "synthetic",
            "--ca-file",
            ca,
            "--broker-wait",
            "8",
        ),
        (
            "device",
            "register",
            "--broker",
            url,
            "--fleet",
            "lab",
            "--device-id",
            "pi-07",
            "--ca-file",
            ca,
            "--timeout",
            "8",
        ),
    )
    for args in commands:
        start = time.monotonic()
        result = edgefl(*args, timeout=60)
        assert result.returncode == ExitCode.AUTH_REFUSED, (args[0], result.stderr)
        assert (
            "requires a client certificate" in one_line_error(result)
            and "--cert-file and --key-file" in result.stderr
        )
        assert time.monotonic() - start < scaled(45)  # no silent retries until a timeout


def test_a_certificate_of_another_ca_is_refused_naming_cert_file(tls_fleet):
    d, url = tls_fleet
    result = edgefl(
        *train_pi07(url),
        "--ca-file",
        d / "certs" / "ca.crt",
        "--cert-file",
        d / "other" / "pi-07.crt",
        "--key-file",
        d / "other" / "pi-07.key",
    )
    assert result.returncode == ExitCode.AUTH_REFUSED
    assert (
        f"refused the client certificate --cert-file {d / 'other' / 'pi-07.crt'}"
        in one_line_error(result)
    )


def test_an_unverifiable_broker_names_ca_file(tls_fleet):
    d, url = tls_fleet
    cert = ("--cert-file", d / "certs" / "pi-07.crt", "--key-file", d / "certs" / "pi-07.key")
    for ca in ((), ("--ca-file", d / "other" / "ca.crt")):
        result = edgefl(*train_pi07(url), *cert, *ca)
        assert result.returncode == ExitCode.CONFIG, result.stderr
        assert (
            "cannot verify the broker's certificate" in one_line_error(result)
            and "--ca-file" in result.stderr
        )


# --- broker: accounts and files Mosquitto reads ---------------------------------------------------

def test_add_device_refuses_an_existing_account_without_force(tmp_path):
    need_mosquitto()
    first = edgefl("broker", "add-device", "pi-07", "--fleet", "lab", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    again = edgefl("broker", "add-device", "pi-07", "--fleet", "lab", cwd=tmp_path)
    assert (
        again.returncode == ExitCode.CONFIG
        and "already has an account" in one_line_error(again)
        and "--force" in again.stderr
    )
    before = (tmp_path / "broker" / "passwd").read_text()
    forced = edgefl("broker", "add-device", "pi-07", "--fleet", "other", "--force", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert (
        forced.stdout.strip() != first.stdout.strip()
        and (tmp_path / "broker" / "passwd").read_text() != before
    )
    acl = (tmp_path / "broker" / "acl").read_text()
    assert (
        acl.count("user pi-07\n") == 1
        and "edgefl/other/devices/pi-07/up" in acl
        and "edgefl/lab/" not in acl
    )


def test_broker_ca_hints_name_the_fleet_and_root_hands_the_broker_files_to_mosquitto(tmp_path):
    need_mosquitto()
    made = edgefl("broker", "ca", "--certs", "broker/certs", "--fleet", "lab", cwd=tmp_path)
    assert (
        made.returncode == 0
        and "edgefl broker add-device NAME --fleet lab --certs broker/certs" in made.stderr
    )
    assert edgefl("broker", "add-device", "pi-07", "--fleet", "lab", cwd=tmp_path).returncode == 0
    files = [
        tmp_path / "broker" / "certs" / "broker.key",
        tmp_path / "broker" / "passwd",
        tmp_path / "broker" / "acl",
    ]
    owner = mosquitto_user() if os.geteuid() == 0 and mosquitto_user() is not None else None
    for path in files:
        st = path.stat()
        assert st.st_mode & 0o777 == 0o600, path
        assert st.st_uid == (owner.pw_uid if owner else os.geteuid()), path
    data = (tmp_path / "broker" / "data").stat()
    assert data.st_uid == (owner.pw_uid if owner else os.geteuid())
    # the client keys and the CA's stay with whoever made them
    assert (tmp_path / "broker" / "certs" / "ca.key").stat().st_uid == os.geteuid()


# --- train --print-config -------------------------------------------------------------------------

def test_print_config_shows_the_files_values_and_then_names_the_missing_setting(tmp_path):
    (tmp_path / "device.toml").write_text(
        'broker = "mqtt://broker.lan:1883"\nfleet = "lab"\ndata = "fashion-mnist"\n'
    )
    result = edgefl("train", "--config", tmp_path / "device.toml", "--print-config")
    assert result.returncode == ExitCode.CONFIG
    assert f'broker = "mqtt://broker.lan:1883"  # file {tmp_path / "device.toml"}' in result.stdout
    assert f'fleet = "lab"  # file {tmp_path / "device.toml"}' in result.stdout
    assert "device_id = null  # default" in result.stdout
    assert (
        "needs --device-id (or EDGEFL_DEVICE_ID, or device_id = ... in the --config file)"
        in one_line_error(result)
    )
    complete = edgefl(
        "train", "--config", tmp_path / "device.toml", "--print-config", EDGEFL_DEVICE_ID="pi-07"
    )
    assert complete.returncode == 0 and 'device_id = "pi-07"  # env' in complete.stdout


# --- deploy and the agent -------------------------------------------------------------------------

def _agent(url: str, models: Path, device: str = "pi-07"):
    """``edgefl device agent`` and a queue of its output lines (read by a thread: no read blocks the
    test)."""
    import queue
    import threading

    proc = subprocess.Popen(
        device_agent(url, "lab", device, models),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env(),
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    _until(lines, "model agent of")
    return proc, lines


def _until(lines, text: str, timeout: float = 60.0) -> str:
    import queue

    seen, end = [], time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            line = lines.get(timeout=max(0.01, end - time.monotonic()))
        except queue.Empty:
            break
        seen.append(line)
        if text in line:
            return "".join(seen)
    raise AssertionError(f"{text!r} never came: {''.join(seen)}")


def test_the_agent_says_every_install_and_rollback_and_deploy_says_a_device_is_offline(tmp_path):
    with EmbeddedBroker(port=0) as broker:

        def deploy(*flags, device="pi-07", wait=30):
            """``edgefl deploy`` to ``device`` of fleet lab, waiting ``wait`` s for its answer."""
            lab = ("--broker", broker.url, "--fleet", "lab", "--wait", str(wait))
            return edgefl("deploy", "--device", device, *flags, *lab)

        agent, lines = _agent(broker.url, tmp_path / "models")
        try:
            for version in ("v1", "v2"):
                done = deploy("--model", MODEL, "--version", version)
                assert done.returncode == 0, done.stderr
                assert f"installed {version} (fp32" in _until(lines, f"installed {version}")
            back = deploy("--rollback")
            assert back.returncode == 0, back.stderr
            assert "rolled back from v2 to v1" in _until(lines, "rolled back")
        finally:
            agent.send_signal(signal.SIGTERM)
            agent.wait(30)
        offline = deploy("--model", MODEL, "--version", "v3", wait=3)
        assert offline.returncode == ExitCode.ERROR
        assert (
            "pi-07: the device is offline" in offline.stderr
            and "version None" not in offline.stderr
        )
        never = deploy("--model", MODEL, device="pi-99", wait=2)
        assert (
            never.returncode == ExitCode.ERROR and "never connected a model agent" in never.stderr
        )
        # an earlier version's agent said it on the device's `status` topic (now its own `agent`)
        from edgefl.rollout import _connect
        from edgefl.transport.mqtt import BrokerAddress
        from edgefl.wire.schema import device_status

        earlier = _connect(BrokerAddress.parse(broker.url), "earlier", "lab").start()
        earlier.client.publish("edgefl/lab/devices/pi-08/status",
                               device_status("offline", "0" * 16), qos=1,
                               retain=True).wait_for_publish(30)
        earlier.stop()
        old = deploy("--model", MODEL, "--version", "v3", device="pi-08", wait=2)
        assert old.returncode == ExitCode.ERROR and "pi-08: the device is offline" in old.stderr
