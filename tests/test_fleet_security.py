"""Mutual TLS and the fleet-scoped ACL against a real Mosquitto.

One broker with a password listener and a TLS listener (client certificate required, its common
name taken as the username, client id replaced by the username). What device A's credentials try
(by password and by certificate) and what outsiders try must each be refused; a 3-device fleet
over mutual TLS trains 2 rounds.
"""

import logging
import os
import ssl
import threading
import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from edgefl.errors import ConfigError
from edgefl.transport.accounts import acl_block, add_acl, add_user
from edgefl.transport.broker import MosquittoBroker, mosquitto_binary
from edgefl.transport.mqtt import BrokerAddress, MqttServerTransport
from edgefl.transport.tls import FleetCA
from edgefl.wire import Envelope, Payload, encode
from tests.conftest import scaled, wait_until

pytestmark = pytest.mark.slow
FLEET = "lab"


def need_mosquitto():
    if mosquitto_binary() is None:
        msg = "mosquitto is not installed"
        if os.environ.get("CI") == "true":
            pytest.fail(msg + " (CI must install it)")
        pytest.skip(msg)


@pytest.fixture(scope="module")
def fleet_broker(tmp_path_factory):
    need_mosquitto()
    d = tmp_path_factory.mktemp("fleet-security")
    ca = FleetCA.create(d / "certs", fleet=FLEET)
    crt, key = ca.issue_broker()
    passwd, acl = d / "passwd", d / "acl"
    secrets = {
        "edgefl-server": add_user(passwd, acl, "edgefl-server", fleet=FLEET, role="server"),
        "other-server": add_user(passwd, acl, "other-server", fleet="other", role="server"),
        "dev-a": add_user(passwd, acl, "dev-a", fleet=FLEET),
        "dev-b": add_user(passwd, acl, "dev-b", fleet=FLEET),
    }
    for name in ("edgefl-server", "other-server", "ops", "dev-a", "dev-b", "d00", "d01", "d02"):
        role = "server" if "server" in name else "operator" if name == "ops" else "device"
        add_acl(acl, name, "other" if name == "other-server" else FLEET, role=role)
        ca.issue_client(name)
    rogue = FleetCA.create(d / "rogue", fleet=FLEET)
    rogue.issue_client("dev-a")
    with MosquittoBroker(
        port=0, password_file=passwd, acl_file=acl, tls=(ca.ca_file, crt, key), workdir=d / "mosq"
    ) as broker:
        yield broker, secrets, d


class Conn:
    """A raw paho client; records its CONNACK, disconnects and received messages."""

    def __init__(
        self,
        broker,
        d,
        *,
        user=None,
        password=None,
        cert=None,
        ca_dir="certs",
        client_id=None,
        subscribe=(),
    ):
        self.received, self.disconnects = [], []
        self.connack = None
        self.connected = threading.Event()
        self.answered = threading.Event()  # a CONNACK or a disconnect: no need to wait longer
        self.subscribed = threading.Event()  # every SUBACK in (granted or not)
        acks = []
        self.c = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id or f"t-{time.monotonic_ns()}",
            protocol=mqtt.MQTTv5,
        )
        port = broker.port
        if user is not None:
            self.c.username_pw_set(user, password)
        # TLS: cert is a client name in ca_dir, or "" for no client certificate
        if cert is not None:
            files = (
                {}
                if cert == ""
                else {
                    "certfile": str(d / ca_dir / f"{cert}.crt"),
                    "keyfile": str(d / ca_dir / f"{cert}.key"),
                }
            )
            self.c.tls_set(
                ca_certs=str(d / "certs" / "ca.crt"), cert_reqs=ssl.CERT_REQUIRED, **files
            )
            port = broker.tls_port

        def on_connect(cl, userdata, flags, reason, props):
            self.connack = reason
            self.answered.set()
            if not reason.is_failure:
                for t in subscribe:
                    cl.subscribe(t, qos=1)
                self.connected.set()

        self.c.on_connect = on_connect

        def on_subscribe(cl, userdata, mid, reasons, props):
            acks.append(mid)
            if len(acks) == len(subscribe):
                self.subscribed.set()

        self.c.on_subscribe = on_subscribe
        if not subscribe:
            self.subscribed.set()

        def on_disconnect(cl, userdata, flags, reason, props):
            self.disconnects.append(str(reason))
            self.answered.set()

        self.c.on_disconnect = on_disconnect
        self.c.on_message = lambda cl, u, m: self.received.append((m.topic, m.payload))
        try:
            self.c.connect("127.0.0.1", port, keepalive=10)
            self.c.loop_start()
            self.answered.wait(scaled(3))
            time.sleep(0.05)  # a refused TLS session may be accepted first and closed just after
        except (OSError, ssl.SSLError) as e:
            self.connack = e

    @property
    def ok(self):
        return self.connected.is_set()

    def publish(self, topic, payload):
        self.c.publish(topic, payload, qos=1)

    def close(self):
        self.c.loop_stop()
        try:
            self.c.disconnect()
        except Exception:  # noqa: S110 - a refused client may already be gone
            pass


@pytest.mark.parametrize("credential", ["password", "certificate"])
def test_every_forbidden_action_of_a_device_is_refused(fleet_broker, credential):
    # Prepare: the lab server and the other fleet's server listen everywhere they may
    broker, secrets, d = fleet_broker
    watch = [
        "edgefl/+/devices/+/up",
        "edgefl/+/devices/+/register",
        "edgefl/+/devices/+/status",
        "edgefl/+/devices/+/down",
    ]
    server = Conn(
        broker,
        d,
        user="edgefl-server",
        password=secrets["edgefl-server"],
        client_id="edgefl-lab-server",
        subscribe=[t.replace("+", FLEET, 1) for t in watch],
    )
    other = Conn(
        broker,
        d,
        user="other-server",
        password=secrets["other-server"],
        subscribe=[t.replace("+", "other", 1) for t in watch],
    )
    as_a = (
        {"user": "dev-a", "password": secrets["dev-a"]}
        if credential == "password"
        else {"cert": "dev-a"}
    )
    a = Conn(broker, d, **as_a, subscribe=[
        f"edgefl/{FLEET}/devices/dev-b/down",  # B's downlink
        f"edgefl/{FLEET}/devices/dev-a/down",  # its own
        "edgefl/other/devices/dev-a/down",  # its id in another fleet
        f"edgefl/{FLEET}/devices/+/up",  # everyone's uplinks
    ])
    assert server.ok and other.ok and a.ok
    assert all(c.subscribed.wait(scaled(10)) for c in (server, other, a)), (
        "a subscription was not acknowledged"
    )

    # Execute: what A's credentials must not do, then one allowed publish each way as a control
    forbidden_publishes = [
        f"edgefl/{FLEET}/devices/dev-b/up",
        f"edgefl/{FLEET}/devices/dev-b/register",
        f"edgefl/{FLEET}/devices/dev-b/status",
        # its own downlink: requests come only from the server
        f"edgefl/{FLEET}/devices/dev-a/down",
        f"edgefl/{FLEET}/devices/dev-a/model",  # nor can it roll a model out to itself
        "edgefl/other/devices/dev-a/up",  # acting in another fleet
        "edgefl/other/devices/dev-a/register",
        f"edgefl/{FLEET}/broadcast",
        f"edgefl/{FLEET}/server/status",
    ]
    for topic in forbidden_publishes:
        a.publish(topic, b"forged")
    a.publish(f"edgefl/{FLEET}/devices/dev-a/up", b"own")
    server.publish(f"edgefl/{FLEET}/devices/dev-b/down", b"for b")
    other.publish("edgefl/other/devices/dev-a/down", b"other fleet")
    server.publish(f"edgefl/{FLEET}/devices/dev-a/down", b"for a")
    # the allowed messages went after the forbidden ones: once they are in, a forbidden one that
    # got through to the same client would be in too; `other` gets its own message back, and then
    # one more it sends once A's publishes were all handled (a barrier on its connection)
    own, for_a = (
        (f"edgefl/{FLEET}/devices/dev-a/up", b"own"),
        (f"edgefl/{FLEET}/devices/dev-a/down", b"for a"),
    )
    wait_until(
        lambda: (
            own in server.received
            and for_a in a.received
            and ("edgefl/other/devices/dev-a/down", b"other fleet") in other.received
        ),
        "the allowed messages",
        timeout=30,
    )
    other.publish("edgefl/other/devices/dev-a/down", b"sync")
    wait_until(
        lambda: ("edgefl/other/devices/dev-a/down", b"sync") in other.received,
        "other's barrier",
        timeout=30,
    )
    a.close()  # (A's credentials connecting again replace this connection: same username, same id)
    # the server's client id, taken with A's credentials: the broker replaces it with "dev-a"
    thief = Conn(broker, d, **as_a, client_id="edgefl-lab-server")
    # the server's own message comes back after the thief's CONNACK: it was not displaced by then
    server.publish(f"edgefl/{FLEET}/devices/dev-b/down", b"still here")
    wait_until(
        lambda: (
            (f"edgefl/{FLEET}/devices/dev-b/down", b"still here") in server.received
            or server.disconnects
        ),
        "the server's message or its disconnection",
        timeout=30,
    )
    for c in (server, other, thief):
        c.close()

    # Assert: every attempt refused, counted; the controls went through
    reached_server = {t for t, p in server.received + other.received if p == b"forged"}
    refusals = {f"publish {t}": t not in reached_server for t in forbidden_publishes}
    refusals["read B's downlink"] = (
        f"edgefl/{FLEET}/devices/dev-b/down",
        b"for b",
    ) not in a.received
    refusals["read its downlink in another fleet"] = (
        "edgefl/other/devices/dev-a/down",
        b"other fleet",
    ) not in a.received
    refusals["read other devices' uplinks"] = not any(t.endswith("/up") for t, _ in a.received)
    refusals["take the server's client id"] = server.disconnects == [] or server.disconnects == [
        "Normal disconnection"
    ]
    assert refusals == dict.fromkeys(refusals, True), {k: v for k, v in refusals.items() if not v}
    assert len(refusals) == 13
    assert (f"edgefl/{FLEET}/devices/dev-a/up", b"own") in server.received
    assert a.received == [(f"edgefl/{FLEET}/devices/dev-a/down", b"for a")]
    assert thief.ok  # it connected, as dev-a, without displacing anyone


def test_outsiders_are_refused(fleet_broker):
    broker, secrets, d = fleet_broker
    attempts = {
        "wrong password": Conn(broker, d, user="dev-a", password="not-the-password"),
        "unknown user": Conn(broker, d, user="intruder", password="x"),
        "anonymous": Conn(broker, d),
        "certificate from another CA": Conn(broker, d, cert="dev-a", ca_dir="rogue"),
        "no client certificate": Conn(broker, d, cert=""),
        "a password on the TLS listener without a certificate": Conn(
            broker, d, cert="", user="dev-a", password=secrets["dev-a"]
        ),
    }
    control = Conn(broker, d, cert="dev-b")
    for c in (*attempts.values(), control):
        c.close()
    refused = {name: not c.ok for name, c in attempts.items()}
    assert refused == dict.fromkeys(attempts, True)
    assert len(refused) == 6
    assert control.ok
    # the wrong password is refused by MQTT itself (not a network failure)
    assert (
        attempts["wrong password"].connack is not None
        and attempts["wrong password"].connack.is_failure
    )


def test_the_server_drops_an_uplink_naming_another_device(fleet_broker, caplog):
    # Prepare: the real server transport over mutual TLS
    broker, secrets, d = fleet_broker
    certs = d / "certs"
    url = f"{broker.tls_url}&cert={certs / 'edgefl-server.crt'}&key={certs / 'edgefl-server.key'}"
    transport = MqttServerTransport(BrokerAddress.parse(url), FLEET).start()
    forged = encode(
        Envelope("update", 0, "dev-b", fleet=FLEET, payload=Payload({}, {"num_samples": 1}))
    )
    try:
        with caplog.at_level(logging.WARNING, logger="edgefl.transport.mqtt"):
            # Execute: dev-a, on its own uplink, sends an envelope that names dev-b
            a = Conn(broker, d, cert="dev-a")
            a.publish(f"edgefl/{FLEET}/devices/dev-a/up", forged)
            wait_until(
                lambda: "names device 'dev-b'" in caplog.text,
                "the transport to log the forgery",
                timeout=30,
            )
            a.close()
    finally:
        transport.close()
    # Assert: logged and dropped (never counted as anyone's reply)
    assert "names device 'dev-b' but came on 'dev-a'" in caplog.text
    assert transport.stats.bytes_up == {}


def test_acl_blocks_are_fleet_scoped():
    block = acl_block("pi-07", "lab")
    assert "topic write edgefl/lab/devices/pi-07/up" in block
    # the model agent's own status topic, apart from the training process's
    assert "topic write edgefl/lab/devices/pi-07/agent" in block
    assert "down" not in "".join(
        line for line in block.splitlines() if line.startswith("topic write")
    )
    assert "+" not in block.replace("edgefl/lab/", "")  # no fleet wildcard anywhere
    assert acl_block("srv", "lab", role="server") == "user srv\ntopic readwrite edgefl/lab/#\n"
    for bad in ("a/b", "x+", "#", ""):
        with pytest.raises(ConfigError):
            acl_block(bad, "lab")
    with pytest.raises(ConfigError):
        acl_block("pi-07", "lab/x")
    with pytest.raises(ConfigError):
        acl_block("pi-07", "lab", role="admin")


def test_private_keys_are_0600_and_never_overwritten(tmp_path):
    ca = FleetCA.create(tmp_path, fleet="lab")
    crt, key = ca.issue_client("pi-07")
    assert (tmp_path / "ca.key").stat().st_mode & 0o777 == 0o600
    assert key.stat().st_mode & 0o777 == 0o600
    assert b"PRIVATE KEY" not in crt.read_bytes()
    with pytest.raises(ConfigError, match="refusing to overwrite"):
        ca.issue_client("pi-07")
    with pytest.raises(ConfigError, match="already holds"):
        FleetCA.create(tmp_path)


def test_a_three_device_fleet_trains_over_mutual_tls_and_the_acl(fleet_broker, tmp_path):
    """...then each `edgefl train --models-dir` stays as the model agent and takes a deployment."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from edgefl.runtime.server import ServeOptions, serve
    from tests.commands import fleet_devices
    from tests.conftest import tiny_config
    from tests.test_rollout import tiny_onnx

    # Prepare: every process holds only its own certificate (CN = its account)
    broker, _, d = fleet_broker
    certs = d / "certs"

    def url(name):
        return f"{broker.tls_url}&cert={certs / (name + '.crt')}&key={certs / (name + '.key')}"

    cfg = tiny_config(
        tmp_path, algorithm="fedavg", rounds=2, clients=3, fraction=1.0, min_devices=3
    )
    procs = list(fleet_devices(
        cfg, url, FLEET, tmp_path, lambda d: ["--models-dir", str(tmp_path / f"models-{d}")],
        verbose=True,
    ).values())
    (tmp_path / "m.onnx").write_bytes(tiny_onnx(5))
    try:
        # Execute: the run, then a rollout from the operator's account over TLS
        summary = serve(
            cfg,
            ServeOptions(
                broker=url("edgefl-server"),
                fleet=FLEET,
                deadline=scaled(60),
                wait_for_devices=scaled(120),
            ),
        )
        deployed = subprocess.run(
            [
                sys.executable,
                "-m",
                "edgefl.cli.main",
                "deploy",
                "--model",
                str(tmp_path / "m.onnx"),
                "--version",
                "tls-v1",
                "--device",
                "d00",
                "--device",
                "d01",
                "--device",
                "d02",
                "--broker",
                url("ops"),
                "--fleet",
                FLEET,
                "--wait",
                str(scaled(90)),
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=scaled(180),
        )
        for p in procs:
            p.terminate()  # the agents stop cleanly on SIGTERM
        codes = [p.wait(scaled(60)) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    # Assert: both rounds completed by all three devices, over TLS
    rounds = [
        json.loads(line)
        for line in (Path(summary["run_dir"]) / "rounds.jsonl").read_text().splitlines()
    ]
    assert [r["completed"] for r in rounds] == [["d00", "d01", "d02"]] * 2
    assert codes == [0, 0, 0]
    assert json.loads((Path(summary["run_dir"]) / "config.json").read_text())["broker"].startswith(
        "mqtts://"
    )
    assert 0.0 <= summary["mean_accuracy"] <= 1.0
    assert deployed.returncode == 0, deployed.stderr
    assert {d: r["version"] for d, r in json.loads(deployed.stdout).items()} == dict.fromkeys(
        ["d00", "d01", "d02"], "tls-v1"
    )
    assert all(
        (tmp_path / f"models-d{i:02d}" / "versions" / "tls-v1.onnx").read_bytes() == tiny_onnx(5)
        for i in range(3)
    )


def test_the_shipped_tls_config_with_the_cli_made_files(tmp_path):
    """`edgefl broker ca` + `add-device --certs` + broker/mosquitto-tls.conf: a device connects."""
    import subprocess
    import sys
    from pathlib import Path

    from edgefl.transport.broker import free_port, wait_for_port

    need_mosquitto()
    # Prepare: the operator's steps, in a scratch copy of the repository's broker/ layout
    cli = [sys.executable, "-m", "edgefl.cli.main", "broker"]
    for args in (["ca", "--certs", "broker/certs", "--fleet", "lab"],
                 ["add-device", "pi-07", "--fleet", "lab", "--certs", "broker/certs"]):
        done = subprocess.run(cli + args, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "PRIVATE KEY" not in done.stdout + done.stderr
    port = free_port()
    conf = (Path(__file__).parents[1] / "broker" / "mosquitto-tls.conf").read_text()
    conf = conf.replace("listener 8883 0.0.0.0", f"listener {port} 127.0.0.1").replace(
        "persistence true", "persistence false"
    )
    if os.geteuid() == 0:
        conf += "user root\n"
    (tmp_path / "broker" / "mosquitto-tls.conf").write_text(conf)
    proc = subprocess.Popen([mosquitto_binary(), "-c", "broker/mosquitto-tls.conf"], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port("127.0.0.1", port)
        broker = type("B", (), {"tls_port": port, "port": port})()
        # Execute: the device with its certificate, and a client without one
        device = Conn(broker, tmp_path / "broker", cert="pi-07")
        stranger = Conn(broker, tmp_path / "broker", cert="")
        for c in (device, stranger):
            c.close()
    finally:
        proc.terminate()
        proc.wait(10)
    # Assert
    assert device.ok and not stranger.ok
    assert (tmp_path / "broker" / "certs" / "pi-07.key").stat().st_mode & 0o777 == 0o600
    assert (
        "user pi-07\ntopic write edgefl/lab/devices/pi-07/up"
        in (tmp_path / "broker" / "acl").read_text()
    )
