"""A fleet run over real Mosquitto with real processes (`edgefl server start`, `edgefl train`),
from start to rollout: a device killed mid-run is not waited for in later rounds, the run ends
with a measured result (the killed device with its last per-round evaluation, marked), the
retained status says "finished" with the result, the devices' final models reach
runs/<name>/models so that `export --run --all` and `deploy --run` work as on a simulated run;
a final deadline nobody meets still ends with a summary of what was measured (never nan); and
Ctrl-C on the server leaves a complete record marked interrupted."""

import json
import signal
import subprocess

import pytest

from edgefl.errors import TransportError
from edgefl.rollout import ModelStore
from edgefl.runtime.status_read import read_status_from_broker
from edgefl.transport.broker import MosquittoBroker
from edgefl.transport.mqtt import BrokerAddress
from tests.commands import device_agent, run_ok, server_start, stop, tiny_run
from tests.conftest import scaled, tiny_config, wait_until
from tests.needs import need_mosquitto
from tests.server_device_cases import finish, spawn

pytestmark = pytest.mark.slow
# the deadline on an idle 2-core machine, where a round takes ~3 s; the server gets scaled(DEADLINE)
# (a round may wait it out once: the one in flight when d02 is killed)
ROUNDS, DEADLINE = 4, 12


def server_command(broker, fleet, out, *extra, rounds=ROUNDS, devices=3, deadline=None):
    deadline = scaled(DEADLINE) if deadline is None else deadline
    flags = ["--algorithm", "fedavg", "--rounds", str(rounds), "--min-devices", str(devices),
             "--deadline", str(deadline)]
    return server_start(broker.url, fleet, *flags, *tiny_run(out, "r"), *extra)


cli = run_ok


def records(run):  # the lines written so far (a line being written is not one yet)
    text = (run / "rounds.jsonl").read_text() if (run / "rounds.jsonl").exists() else ""
    return [json.loads(x) for x in text[: text.rfind("\n") + 1].splitlines()]


def test_a_fleet_run_with_a_device_killed_ends_measured_and_exports_and_deploys(
    tmp_path, profile_file  # noqa: F811
):
    need_mosquitto()
    cfg = tiny_config(tmp_path, rounds=ROUNDS, clients=3)
    fleet, out = "lab", tmp_path / "runs"
    run = out / "r"
    broker = MosquittoBroker(port=0, workdir=tmp_path / "mosq").start()
    procs, agents = [], []
    deadline = scaled(DEADLINE)
    try:
        server = subprocess.Popen(
            server_command(broker, fleet, out, deadline=deadline),
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / "server.log", "wb"),  # noqa: SIM115
        )
        # each round takes >= 1.5 s (device delay): the kill below lands before round 3
        devices = [
            spawn(broker.url, fleet, cfg, i, tmp_path, profile_file, delay=1.5) for i in range(3)
        ]
        procs = [server, *devices]
        wait_until(lambda: len(records(run)) >= 1, "round 1 to complete")
        devices[2].kill()  # SIGKILL
        devices[2].wait(10)
        server.wait(timeout=scaled(600))
        assert server.returncode == 0, (tmp_path / "server.log").read_text()[-3000:]
        assert finish(devices[:2]) == [0, 0]
        summary = json.loads((run / "summary.json").read_text())
        rounds = records(run)

        # later rounds neither ask nor wait for the killed device
        assert [r["round"] for r in rounds] == [1, 2, 3, 4]
        for r in rounds[2:]:
            assert r["selected"] == ["d00", "d01"] and r["failed"] == {}
            assert r["round_seconds"] < deadline
        # a measured result: the live devices from the final evaluation, d02 from its round-1 one
        assert summary["measured_by"] == "mixed" and summary["accuracy_from_round"] == {"d02": 1}
        assert (
            set(summary["client_accuracy"]) == {"d00", "d01", "d02"}
            and 0 < summary["mean_accuracy"] <= 1
        )
        assert summary["client_accuracy"]["d02"] == rounds[0]["eval"]["client_accuracy"]["d02"]
        page = (run / "summary.md").read_text()
        assert "d02 (round 1)" in page and "nan" not in page.lower()
        log = (tmp_path / "server.log").read_text()
        assert (
            "not asking d02" in log and "final evaluation of 2 devices" in log and "nan" not in log
        )
        # the device logs count rounds as the server does
        d00 = (tmp_path / "d00.log").read_text()
        assert (
            "round 1 | tier" in d00
            and "round 4 | tier" in d00
            and "(eval r3)" in d00
            and "round 0 |" not in d00
        )

        # the retained status: finished, with the result; the server is gone
        status = json.loads(
            cli("fleet", "status", "--broker", broker.url, "--fleet", fleet, "--json").stdout
        )
        assert (
            status["server"]["phase"] == "finished" and status["server"]["connection"] == "offline"
        )
        assert status["server"]["result"]["mean_accuracy"] == pytest.approx(
            summary["mean_accuracy"]
        )
        assert (
            status["server"]["result"]["measured_by"] == "mixed"
            and status["server"]["round"] == ROUNDS
        )
        text = cli("fleet", "status", "--broker", broker.url, "--fleet", fleet).stdout
        assert "finished after round 4 of 4" in " ".join(
            text.split()
        ) and "mean accuracy over 3 devices" in " ".join(text.split())

        # the live devices' final models came back over MQTT: export and deploy as for a simulation
        assert sorted(p.name for p in (run / "models").iterdir()) == [
            "d00.safetensors",
            "d01.safetensors",
        ]
        assert summary["models_missing"] == ["d02"]
        exported = json.loads(
            cli("export", "--run", str(run), "--all", "--out", str(run / "onnx"),
                "--test-samples", "0", "--json").stdout
        )
        assert [r["device_id"] for r in exported if "path" in r] == ["d00", "d01"]
        assert [r["device_id"] for r in exported if r.get("skipped")] == ["d02"]
        stores = {d: tmp_path / "dev" / d for d in ("d00", "d01", "d02")}
        agents = [
            subprocess.Popen(
                device_agent(broker.url, fleet, d, stores[d]),
                stderr=open(tmp_path / f"agent-{d}.log", "wb"),  # noqa: SIM115
            )
            for d in stores
        ]
        deployed = cli("deploy", "--run", str(run), "--version", "v1", "--wait", str(scaled(120)),
                       "--json", "--broker", broker.url, "--fleet", fleet)
        reports = json.loads(deployed.stdout)
        assert {d: r["version"] for d, r in reports.items()} == {"d00": "v1", "d01": "v1"}
        assert "skipping d02" in deployed.stderr
        for d in ("d00", "d01"):  # each device runs the model it trained, as exported
            assert (
                ModelStore(stores[d]).active_path().read_bytes()
                == (run / "onnx" / f"{d}.onnx").read_bytes()
            )
    finally:
        stop(*procs, *agents)
        broker.stop()


def test_a_final_deadline_nobody_meets_still_ends_with_what_was_measured(
    tmp_path, profile_file  # noqa: F811
):
    need_mosquitto()
    cfg = tiny_config(tmp_path, rounds=2, clients=2)
    fleet, out = "short", tmp_path / "runs"
    broker = MosquittoBroker(port=0, workdir=tmp_path / "mosq").start()
    procs = []
    try:
        # no reply crosses a broker and two processes in a millisecond
        server = subprocess.Popen(
            server_command(
                broker,
                fleet,
                out,
                "--final-deadline",
                "0.001",
                "--test-samples",
                "50",
                rounds=2,
                devices=2,
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        devices = [spawn(broker.url, fleet, cfg, i, tmp_path, profile_file) for i in range(2)]
        procs = [server, *devices]
        _, stderr = server.communicate(timeout=600)
        assert server.returncode == 0, stderr.decode()[-3000:]
        assert finish(devices) == [0, 0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        broker.stop()
    run = out / "r"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["measured_by"] == "last-round" and summary["accuracy_from_round"] == {
        "d00": 2,
        "d01": 2,
    }
    assert summary["mean_accuracy"] is not None and 0 < summary["mean_accuracy"] <= 1
    console = stderr.decode()
    for text in (console, (run / "summary.md").read_text(), json.dumps(summary)):
        assert "nan" not in text.lower()
    assert "d00 from its round-2 evaluation" in " ".join(console.split())
    assert "final evaluation: 0 of 2 devices answered" in " ".join(console.split())
    assert (run / "accuracy.png").exists()


def test_ctrl_c_on_the_server_leaves_a_complete_record_marked_interrupted(
    tmp_path, profile_file  # noqa: F811
):
    need_mosquitto()
    cfg = tiny_config(tmp_path, rounds=20, clients=2)
    fleet, out = "stop", tmp_path / "runs"
    run = out / "r"
    broker = MosquittoBroker(port=0, workdir=tmp_path / "mosq").start()
    procs = []
    try:
        server = subprocess.Popen(
            server_command(broker, fleet, out, rounds=20, devices=2),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        devices = [
            spawn(broker.url, fleet, cfg, i, tmp_path, profile_file, delay=1.0) for i in range(2)
        ]
        procs = [server, *devices]
        wait_until(lambda: len(records(run)) >= 2, "round 2 to complete")
        server.send_signal(signal.SIGINT)
        _, stderr = server.communicate(timeout=300)
        assert server.returncode == 130, stderr.decode()[-3000:]
        assert finish(devices) == [0, 0]  # the run is over for them too
        status = json.loads(
            cli("fleet", "status", "--broker", broker.url, "--fleet", fleet, "--json").stdout
        )
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        broker.stop()
    summary = json.loads((run / "summary.json").read_text())
    done = summary["rounds_completed"]
    assert summary["interrupted"] is True and 2 <= done < 20 and len(records(run)) == done
    assert summary["measured_by"] == "last-round" and summary["mean_accuracy"] is not None
    assert (run / "accuracy.png").exists() and (run / "bytes.png").exists()
    assert "Interrupted" in (run / "summary.md").read_text()
    assert sorted(p.name for p in (run / "models").iterdir()) == [
        "d00.safetensors",
        "d01.safetensors",
    ]
    assert (
        status["server"]["phase"] == "interrupted"
        and status["server"]["result"]["rounds_completed"] == done
    )
    assert json.loads((run / "status.json").read_text())["server"]["phase"] == "interrupted"
    assert f"interrupted after round {done} of 20" in " ".join(stderr.decode().split())


def test_a_server_that_dies_reads_as_stopped_not_live(tmp_path):
    need_mosquitto()
    fleet, out = "gone", tmp_path / "runs"
    broker = MosquittoBroker(port=0, workdir=tmp_path / "mosq").start()
    try:
        server = subprocess.Popen(
            server_command(broker, fleet, out, devices=1),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            waiting, address = {}, BrokerAddress.parse(broker.url)

            def says_waiting():  # what `fleet status --json` reads, in this process
                try:
                    waiting.update(read_status_from_broker(address, fleet, timeout=2))
                except TransportError:  # nothing retained yet
                    return False
                return waiting.get("server", {}).get("phase") == "waiting"

            wait_until(says_waiting, "the server's waiting status", poll=0.2)
            assert waiting["server"]["registered"] == 0 and waiting["server"]["expected"] == 1
            server.send_signal(signal.SIGKILL)  # no clean exit: its Last Will speaks
            server.wait(scaled(10))
        finally:
            if server.poll() is None:
                server.kill()
        status = json.loads(
            cli("fleet", "status", "--broker", broker.url, "--fleet", fleet, "--json").stdout
        )
    finally:
        broker.stop()
    assert status["server"]["phase"] == "stopped" and status["server"]["connection"] == "offline"
