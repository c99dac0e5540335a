"""What tests/test_server_device*.py (and the live tests of injection, hostile peers and secure
aggregation) share: device processes of a run, a server run in a thread with devices, its
finish, the records of its rounds, and a raw MQTT peer."""

import functools
import json
import subprocess
import threading
from pathlib import Path

import numpy as np
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from edgefl.runtime.fleet import (
    DeviceLauncher,
    data_spec_for,
    device_command,
)
from edgefl.runtime.server import serve
from edgefl.transport.mqtt import Topics
from tests.conftest import scaled


def spawn(
    url,
    fleet,
    cfg,
    index,
    tmp_path,
    profile_file,
    *,
    delay=0.0,
    suffix="",
    tier=None,
    launcher=None,
):
    device_id = f"d{index:02d}"
    cmd = device_command(
        url,
        fleet,
        device_id,
        data_spec_for(cfg, index),
        profile_file=profile_file,
        delay=delay,
        verbose=True,
        tier=tier,
    )
    return (launcher or device_launcher()).start(cmd, tmp_path / f"{device_id}{suffix}.log")


@functools.cache
def device_launcher() -> DeviceLauncher:
    """This test process's launcher of device processes: forked from one fork server that imported
    torch and edgefl once, as ``simulate --transport mqtt`` starts its devices (an exec'd device
    imports torch again: about 2.5 CPU seconds each). The device runs the same ``edgefl train``
    (tests/test_device_launcher.py: forked and exec'd devices behave alike; exec'd ones run in
    test_console, test_exit_codes, test_dashboard_browser and the fleet files' own commands)."""
    from edgefl.cli.simulate import device_entry

    return DeviceLauncher(device_entry)


def finish(procs, timeout=60, server=None):
    """The exit codes of the device processes ``procs`` ("hung": killed after ``timeout`` s), once
    the ``server`` thread (serve_in_thread's) has ended the run."""
    if server is not None:
        server.join(scaled(300))
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=scaled(timeout)))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append("hung")
    return codes


def serve_in_thread(cfg, opts):
    box = {}

    def run():
        try:
            box["summary"] = serve(
                cfg,
                opts,
                on_started=lambda t: box.__setitem__("transport", t),
                on_done=lambda s: box.__setitem__("state", s.state_dict()),
            )
        except BaseException as e:  # reported by the test
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def round_records(box) -> list[dict]:
    """The round records of the run the server in ``box`` finished."""
    rounds = (Path(box["summary"]["run_dir"]) / "rounds.jsonl").read_text()
    return [json.loads(line) for line in rounds.splitlines()]


def assert_same_state(got: dict, expected: dict) -> None:
    """The server state over MQTT is the in-memory run's, array by array."""
    assert set(got) == set(expected) and expected
    for k in expected:
        np.testing.assert_allclose(got[k], expected[k], rtol=1e-5, atol=1e-6, err_msg=k)


def serve_with_devices(cfg, opts, devices, tmp_path, profile_file, *, join=300):
    """Serve ``cfg`` in a thread with ``devices`` device processes (d00 1.5 s late: the others
    register first), wait up to ``join`` (scaled) seconds for the server, then for the devices:
    (the server's box, the devices' exit codes)."""
    t, box = serve_in_thread(cfg, opts)
    procs = [
        spawn(opts.broker, opts.fleet, cfg, i, tmp_path, profile_file, delay=1.5 if i == 0 else 0.0)
        for i in range(devices)
    ]
    t.join(scaled(join))
    return box, finish(procs)


class Peer:
    """A raw MQTT client of ``fleet`` on the broker at ``port`` (an attacker holding d00's
    credentials); subclasses subscribe in ``on_connect`` and act in ``on_message``."""

    def __init__(self, port: int, fleet: str, client_id: str):
        self.topics, self.fleet, self.port = Topics(fleet), fleet, port
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5
        )
        self.client.on_connect = self.on_connect
        self.client.on_message = self.on_message
        self.lock = threading.Lock()
        self.seen: set[str] = set()

    def on_connect(self, client, userdata, flags, reason, props):
        client.subscribe(self.topics.device("d00", "down"), qos=1)

    def on_message(self, client, userdata, msg):
        pass

    def start(self):
        self.client.connect("127.0.0.1", self.port)
        self.client.loop_start()
        return self

    def stop(self):
        self.client.loop_stop()
        self.client.disconnect()
