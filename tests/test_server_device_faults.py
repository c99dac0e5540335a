"""Server and device processes over real brokers, when something goes wrong:

- a device killed mid-round: its Last Will fails its request at once, the device rejoins; the broker
  restarted mid-run: the run completes; the server SIGKILLed and restarted: it resumes;
- malformed, oversized, non-finite, wrong-shape and unknown-kind messages: rejected with a
  logged reason while the server keeps serving.
"""

import json
import signal
import subprocess
import sys
import threading

import numpy as np
import paho.mqtt.client as mqtt
import pytest
import safetensors.numpy
from paho.mqtt.enums import CallbackAPIVersion

from edgefl.runtime.fleet import (
    SIMULATED_PROFILE,
)
from edgefl.runtime.server import ServeOptions
from edgefl.transport.broker import EmbeddedBroker, MosquittoBroker
from edgefl.transport.mqtt import Topics
from edgefl.wire import Envelope, Payload, encode
from edgefl.wire.validate import peek
from tests.commands import tiny_run
from tests.conftest import scaled, tiny_config, wait_until
from tests.needs import need_mosquitto
from tests.server_device_cases import (
    finish,
    round_records,
    serve_in_thread,
    spawn,
)

pytestmark = pytest.mark.slow


def test_device_kill_broker_restart_and_server_kill_resume(tmp_path, profile_file):
    need_mosquitto()
    cfg = tiny_config(tmp_path, algorithm="fedavg", rounds=5, clients=3)
    fleet = "chaos"
    # d02 is killed in round 1 (its Last Will fails its request at once); the deadline: 12 s on an
    # idle 2-core machine, stretched by the measured speed factor so that d00 and d01 make it under
    # load too
    deadline = scaled(12)
    broker = MosquittoBroker(port=0, workdir=tmp_path / "mosq").start()
    watcher = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="watcher", protocol=mqtt.MQTTv5)
    seen = []  # (direction, routing) of d02's traffic
    watcher.on_connect = lambda c, u, f, rc, p: [
        c.subscribe(Topics(fleet).device("d02", way), qos=1) for way in ("down", "up")
    ]
    watcher.on_message = lambda c, u, m: (
        seen.append((m.topic.rsplit("/", 1)[-1], peek(m.payload))) if m.payload else None
    )
    watcher.connect("127.0.0.1", broker.port)
    watcher.loop_start()
    out_dir, ck = tmp_path / "runs", tmp_path / "ck"
    server_cmd = [
        sys.executable,
        "-m",
        "edgefl.cli.main",
        "--verbose",
        "server",
        "start",
        "--broker",
        broker.url,
        "--fleet",
        fleet,
        "--algorithm",
        "fedavg",
        "--rounds",
        "5",
        "--min-devices",
        "3",
        "--deadline",
        str(deadline),
        "--checkpoint-dir",
        str(ck),
        *tiny_run(out_dir, "r"),
        "--json",
    ]
    rounds_file = out_dir / "r" / "rounds.jsonl"

    def rounds():  # the lines written so far (a line being written is not one yet)
        text = rounds_file.read_text() if rounds_file.exists() else ""
        return [json.loads(x) for x in text[: text.rfind("\n") + 1].splitlines()]

    procs = []
    try:
        server = subprocess.Popen(
            server_cmd, stdout=subprocess.PIPE, stderr=open(tmp_path / "server1.log", "wb")
        )
        # every round takes >= 1.5 s (device delay), so the SIGKILL below lands mid-run however fast
        # the transport
        devices = [
            spawn(broker.url, fleet, cfg, i, tmp_path, profile_file, delay=120.0 if i == 2 else 1.5)
            for i in range(3)
        ]
        procs = [*devices, server]
        # a device dies in the middle of round 1 (it acknowledged the request and is "training" for
        # 120 s), then comes back
        wait_until(
            lambda: any(way == "up" and r.kind == "ack" and r.round == 0 for way, r in seen),
            "d02 to take round 1",
        )  # index 0 on the wire
        devices[2].kill()  # SIGKILL
        devices[2].wait(scaled(10))
        devices[2] = spawn(
            broker.url, fleet, cfg, 2, tmp_path, profile_file, suffix="-rejoined", delay=1.5
        )
        procs.append(devices[2])
        # the broker goes away for a second after round 2
        wait_until(lambda: len(rounds()) >= 2, "round 2 to complete")
        broker.restart(down_seconds=1.0)
        # the server is SIGKILLed after round 3 and started again with the same checkpoint dir
        wait_until(lambda: len(rounds()) >= 3, "round 3 to complete")
        server.send_signal(signal.SIGKILL)
        server.wait(scaled(10))
        # the kill lands wherever the server is by now: what counts is the last checkpoint
        killed_after = json.loads((ck / "progress.json").read_text())["rounds_completed"]
        server2 = subprocess.Popen(
            server_cmd, stdout=subprocess.PIPE, stderr=open(tmp_path / "server2.log", "wb")
        )
        procs.append(server2)
        stdout, _ = server2.communicate(timeout=scaled(300))
        device_codes = finish([devices[0], devices[1], devices[2]])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        watcher.loop_stop()
        broker.stop()

    summary = json.loads(stdout.decode().strip().splitlines()[-1])
    records = rounds()
    assert server2.returncode == 0
    assert 3 <= killed_after < 5, "the server must be killed mid-run for this test to mean anything"
    assert summary["resumed_at_round"] == killed_after + 1
    # every round once, across two server processes
    assert [r["round"] for r in records] == [1, 2, 3, 4, 5]
    first = records[0]
    # d02 died while it owed its update and came back as a new process (a new session): failed
    # as it came back (or at the end of the reconnect grace, had it been slower), not at the
    # deadline
    assert first["completed"] == ["d00", "d01"]
    assert "device restarted" in first["failed"]["d02"] or (
        "did not come back" in first["failed"]["d02"])
    assert any("d02" in r["completed"] for r in records[1:])  # the device rejoined
    assert device_codes == [0, 0, 0]
    assert len(summary["client_accuracy"]) == 3
    # the device said what happened as it happened: the broker outage and one line per round
    log = (tmp_path / "d00.log").read_text()
    assert "lost broker" in log and "connected to broker" in log
    round_lines = [
        line for line in log.splitlines() if line.startswith("[d00] round ") and "| loss " in line
    ]
    # from 1, as the server counts
    assert {int(line.split()[2]) for line in round_lines} >= {1, 2, 3, 4, 5}
    # the broker's restart (every device's Last Will, then each back in its session) cost d00 and
    # d01 no round: before the reconnect grace, a round that started as the broker went away failed
    # every device (a CI run under load at 616a8dc: round 3, completed [])
    assert all({"d00", "d01"} <= set(r["completed"]) for r in records), records
    assert all(" kB | down " in line and line.endswith(" s") for line in round_lines)


def _raw_envelope(kind, device_id, fleet):
    meta = {
        "schema": "2",
        "kind": kind,
        "fleet": fleet,
        "round": "0",
        "device": device_id,
        "message_id": "0" * 32,
        "algorithm": "",
        "tier": "",
        "run": "",
        "nonce": "",
        "meta": "{}",
        "checksum": "00000000",
    }
    return safetensors.numpy.save({"a": np.zeros(2, np.float32)}, metadata=meta)


def test_malformed_messages_are_rejected_with_reasons_and_the_server_keeps_serving(
    tmp_path, profile_file, caplog
):
    cfg = tiny_config(tmp_path, algorithm="fedavg", rounds=2, clients=2)
    fleet = "hostile"
    topics = Topics(fleet)
    broker = EmbeddedBroker(port=0).start()
    # mallory: a plain paho client that registers as a device and answers with bad uplinks
    m = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="mallory", protocol=mqtt.MQTTv311)
    answered = set()
    model: dict = {}  # the arrays of the last downlink that carried them (a train request after an
    # evaluation carries none: the device holds the evaluation's model)

    def on_message(client, userdata, msg):
        r = peek(msg.payload)
        if r.kind not in ("train", "evaluate", "finish") or r.message_id in answered:
            return
        answered.add(r.message_id)
        from edgefl.wire import decode

        env = decode(msg.payload)
        client.publish(
            topics.device("mallory", "up"),
            encode(
                Envelope(
                    "ack",
                    r.round,
                    "mallory",
                    fleet=fleet,
                    payload=Payload({}, {"ack": r.message_id}),
                )
            ),
            qos=1,
        )
        if env.payload.arrays:
            model.clear()
            model.update(env.payload.arrays)
        if r.kind == "train":
            arrays = {
                k: v.astype(np.float32) if v.dtype.kind == "f" else v for k, v in model.items()
            }
            name = next(k for k, v in arrays.items() if v.dtype.kind == "f" and v.ndim >= 2)
            if r.round == 0:
                arrays[name] = np.full_like(arrays[name], np.nan)  # non-finite
            else:
                arrays[name] = arrays[name].reshape(arrays[name].shape[0], -1)[:, :1]  # wrong shape
            # a bad update (refused, counted, the exchange goes on), then an error reply: the
            # round closes at once instead of at its deadline
            client.publish(
                topics.device("mallory", "up"),
                encode(env.reply("update", Payload(arrays, {"num_samples": 50}))),
                qos=1,
            )
            reply = env.reply("error", Payload({}, {"reason": "mallory gives up"}))
        elif r.kind == "evaluate":
            reply = env.reply("metrics", Payload({}, {"accuracy": 0.1, "loss": 2.0}))
        else:
            reply = env.reply("done")
        client.publish(topics.device("mallory", "up"), encode(reply), qos=1)

    server_online = threading.Event()

    def on_connect(client, userdata, flags, rc, props):
        client.subscribe(topics.device("mallory", "down"), qos=1)
        client.subscribe(topics.server_status, qos=1)

    def route(client, userdata, msg):
        if msg.topic == topics.server_status:
            if b"online" in msg.payload:
                server_online.set()
            return
        on_message(client, userdata, msg)

    m.on_connect = on_connect
    m.on_message = route
    procs = []
    deadline = scaled(20)  # mallory's error reply closes each round long before it
    try:
        t, box = serve_in_thread(
            cfg.model_copy(update={"min_devices": 3}),
            ServeOptions(broker=broker.url, fleet=fleet, deadline=deadline, max_bytes=2_000_000),
        )
        procs = [spawn(broker.url, fleet, cfg, i, tmp_path, profile_file) for i in range(2)]
        m.connect("127.0.0.1", broker.port)
        m.loop_start()
        # publish only once the server listens: a message to a topic nobody subscribes is gone
        assert server_online.wait(scaled(120)), "the server never came online"
        up, reg = topics.device("mallory", "up"), topics.device("mallory", "register")
        m.publish(up, b"\x07garbage that is no envelope", qos=1)  # malformed
        m.publish(up, b"\x00" * 3_000_000, qos=1)  # oversized
        m.publish(reg, _raw_envelope("bogus", "mallory", fleet), qos=1)  # unknown kind
        m.publish(
            reg,
            encode(
                Envelope(
                    "register",
                    0,
                    "mallory",
                    fleet=fleet,
                    payload=Payload({}, {"profile": "[not json"}),
                )
            ),
            qos=1,
        )
        m.publish(
            topics.device("d00", "up"),
            encode(
                Envelope(
                    "update", 0, "mallory", fleet=fleet, payload=Payload({}, {"num_samples": 1})
                )
            ),
            qos=1,
        )  # posing as d00
        good = {"profile": json.dumps(SIMULATED_PROFILE), "ready": True, "num_samples": 50}
        m.publish(
            reg,
            encode(Envelope("register", 0, "mallory", fleet=fleet, payload=Payload({}, good))),
            qos=1,
        )
        codes = finish(procs, server=t)
    finally:
        m.loop_stop()
        broker.stop()

    assert "error" not in box, box.get("error")
    assert codes == [0, 0]
    records = round_records(box)
    # the honest devices were served
    assert [r["completed"] for r in records] == [["d00", "d01"]] * 2
    assert [r["failed"] for r in records] == [{"mallory": "mallory gives up"}] * 2
    assert [r["rejected"] for r in records] == [{"mallory": 1}] * 2
    assert all(r["round_seconds"] < deadline for r in records)  # no round waited out its deadline
    logs = caplog.text
    assert "has non-finite values" in logs and "has shape" in logs
    assert "header length" in logs or "not JSON" in logs  # malformed
    assert "exceeds the limit of 2000000" in logs  # oversized
    assert "header: kind: Input should be" in logs
    assert "rejected a registration from mallory" in logs
    assert "names device 'mallory' but came on 'd00'" in logs
