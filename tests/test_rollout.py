"""Model rollout: versioned, digest-checked ONNX models installed atomically on devices, the
previous version kept, rollback, refusals that leave the old model serving; over a real
Mosquitto."""

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgefl.rollout import (
    ModelStore,
    RolloutError,
    decode_command,
    deploy_command,
    encode_command,
    rollback_command,
)
from edgefl.transport.accounts import add_user
from edgefl.transport.broker import MosquittoBroker
from tests.commands import device_agent
from tests.conftest import scaled
from tests.needs import need_mosquitto

FLEET = "lab"


def tiny_onnx(seed: int, side: int = 4, classes: int = 3) -> bytes:
    """A classifier [N, 1, side, side] -> [N, classes]: Flatten then Gemm (no torch needed)."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.normal(size=(side * side, classes)).astype(np.float32), "w")
    b = numpy_helper.from_array(np.zeros(classes, np.float32), "b")
    graph = helper.make_graph(
        [
            helper.make_node("Flatten", ["x"], ["f"]),
            helper.make_node("Gemm", ["f", "w", "b"], ["y"]),
        ],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, side, side])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", classes])],
        initializer=[w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


# --- the device's store, without a broker
# ------------------------------------------------------------


def test_install_keeps_the_previous_version_and_rollback_returns_to_it(tmp_path):
    store = ModelStore(tmp_path)
    a, b = tiny_onnx(0), tiny_onnx(1)
    store.apply(deploy_command(FLEET, "d00", a, version="v1"), a)
    report = store.apply(deploy_command(FLEET, "d00", b, version="v2"), b)
    assert report["version"] == "v2" and report["previous"] == ["v1"]
    assert store.active_path().read_bytes() == b
    assert report["digest"] == hashlib.sha256(b).hexdigest()
    report = store.apply(rollback_command(FLEET, "d00"), None)
    assert report["version"] == "v1" and store.active_path().read_bytes() == a
    with pytest.raises(RolloutError, match="no earlier version"):
        store.apply(rollback_command(FLEET, "d00"), None)


def test_a_repeated_command_is_applied_once(tmp_path):
    # a retained message comes again on every reconnect: a rollback must not roll back twice
    store = ModelStore(tmp_path)
    a, b, c = tiny_onnx(0), tiny_onnx(1), tiny_onnx(2)
    for v, m in (("v1", a), ("v2", b), ("v3", c)):
        store.apply(deploy_command(FLEET, "d00", m, version=v), m)
    back = rollback_command(FLEET, "d00")
    store.apply(back, None)
    store.apply(back, None)
    assert store.active()["version"] == "v2"


def test_corrupt_or_mismatched_models_are_refused_and_the_old_one_stays(tmp_path):
    store = ModelStore(tmp_path)
    good = tiny_onnx(0)
    store.apply(deploy_command(FLEET, "d00", good, version="v1"), good)
    before = store.active_path().read_bytes()
    other = tiny_onnx(1)
    tampered = bytearray(other)
    tampered[-20] ^= 0xFF
    # a model that does not load, announced with its own (matching) digest
    junk = b"this is not an onnx model" * 4
    junk_cmd = deploy_command(FLEET, "d00", good, version="v3").model_copy(
        update={"digest": hashlib.sha256(junk).hexdigest(), "size": len(junk)}
    )
    refusals = {
        "digest": (deploy_command(FLEET, "d00", other, version="v2"), bytes(tampered)),
        "not onnx": (junk_cmd, junk),
        "input shape": (
            deploy_command(FLEET, "d00", tiny_onnx(2, side=5), version="v4"),
            tiny_onnx(2, side=5),
        ),
    }
    reasons = {}
    for name, (cmd, data) in refusals.items():
        with pytest.raises(RolloutError) as e:
            store.apply(cmd, data)
        reasons[name] = str(e.value)
    assert "digest mismatch" in reasons["digest"]
    assert "does not load in ONNX Runtime" in reasons["not onnx"]
    assert "[1, 5, 5]" in reasons["input shape"] and "[1, 4, 4]" in reasons["input shape"]
    assert store.active()["version"] == "v1" and store.active_path().read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "versions").iterdir()) == ["v1.onnx"]


def test_malformed_model_messages_are_rejected_with_a_reason():
    import safetensors.numpy

    command = deploy_command(FLEET, "d00", tiny_onnx(0), version="v1")
    good = encode_command(command, tiny_onnx(0))
    body = {"model": np.frombuffer(tiny_onnx(0), np.uint8)}

    def with_meta(**changes):
        return safetensors.numpy.save(
            body, metadata={"edgefl.model_command": json.dumps({**command.model_dump(), **changes})}
        )

    cases = {
        "random bytes": os.urandom(200),
        "truncated": good[:100],
        "huge header length": (10**9).to_bytes(8, "little") + b"{}",
        "unknown action": with_meta(action="format"),
        "device id with a wildcard": with_meta(device_id="d0+"),
        "version with a path": with_meta(version="../../etc/x"),
        "digest not hex": with_meta(digest="z" * 64),
        "input shape as text": with_meta(input_shape="1,4,4"),
        "an extra field": with_meta(shell="rm -rf /"),
        "no metadata": safetensors.numpy.save(body),
        "deploy without a model": safetensors.numpy.save(
            {"none": np.zeros(0, np.uint8)},
            metadata={"edgefl.model_command": command.model_dump_json()},
        ),
    }
    rejected = {}
    for name, data in cases.items():
        try:
            decode_command(data, max_bytes=1 << 20)
        except RolloutError as e:
            rejected[name] = str(e)
    assert sorted(rejected) == sorted(cases), set(cases) - set(rejected)
    with pytest.raises(RolloutError, match="exceeds the limit"):
        decode_command(good, max_bytes=100)
    command, model = decode_command(good, max_bytes=1 << 20)
    assert command.version == "v1" and model == tiny_onnx(0)


# --- over a real broker
# ----------------------------------------------------------------------------------


def cli(*args, timeout=120, ok=True):
    done = subprocess.run(
        [sys.executable, "-m", "edgefl.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=scaled(timeout),
    )
    if ok:
        assert done.returncode == 0, done.stderr
    return done


@pytest.mark.slow
def test_deploy_to_three_devices_rollback_and_a_corrupt_model_over_mosquitto(tmp_path):
    need_mosquitto()
    from edgefl.rollout import publish_commands
    from edgefl.transport.mqtt import BrokerAddress

    # Prepare: accounts, a run directory with one exported model per device, three agents
    passwd, acl = tmp_path / "passwd", tmp_path / "acl"
    devices = ["d00", "d01", "d02"]
    pw = {
        n: add_user(passwd, acl, n, fleet=FLEET, role="operator" if n == "ops" else "device")
        for n in ["ops", *devices]
    }
    broker = MosquittoBroker(
        port=0, password_file=passwd, acl_file=acl, workdir=tmp_path / "mosq"
    ).start()

    def url(name):
        return f"mqtt://{name}:{pw[name]}@127.0.0.1:{broker.port}"

    run = tmp_path / "runs" / "lab1"
    (run / "onnx").mkdir(parents=True)
    (run / "config.json").write_text(
        json.dumps(
            {
                "fleet": {
                    d: {"spec": {"tier": f"t{i}"}, "profile": {"arch": "x86_64"}}
                    for i, d in enumerate(devices)
                }
            }
        )
    )
    for i, d in enumerate(devices):
        (run / "onnx" / f"{d}.onnx").write_bytes(tiny_onnx(10 + i))
    stores = {d: tmp_path / "dev" / d for d in devices}
    agents = [
        subprocess.Popen(
            device_agent(url(d), FLEET, d, stores[d]),
            stderr=open(tmp_path / f"{d}.log", "wb"),  # noqa: SIM115
        )
        for d in devices
    ]
    ops = ["--broker", url("ops"), "--fleet", FLEET]
    try:
        # Execute and Assert: the run's models on all three devices
        first = json.loads(
            cli("deploy", "--run", str(run), "--version", "v1", "--wait", str(scaled(90)), "--json",
                *ops).stdout
        )
        assert {d: r["version"] for d, r in first.items()} == dict.fromkeys(devices, "v1")
        for i, d in enumerate(devices):
            assert ModelStore(stores[d]).active_path().read_bytes() == tiny_onnx(10 + i)
        # a second version from one file, then d01 back to the first
        (tmp_path / "v2.onnx").write_bytes(tiny_onnx(20))
        second = json.loads(
            cli("deploy", "--model", str(tmp_path / "v2.onnx"),
                *sum((["--device", d] for d in devices), []),
                "--version", "v2", "--wait", str(scaled(60)), "--json", *ops).stdout
        )
        assert {d: r["version"] for d, r in second.items()} == dict.fromkeys(devices, "v2")
        back = json.loads(
            cli(
                "deploy", "--rollback", "--device", "d01", "--wait", str(scaled(60)), "--json", *ops
            ).stdout
        )
        assert back["d01"]["version"] == "v1" and ModelStore(
            stores["d01"]
        ).active_path().read_bytes() == tiny_onnx(11)

        # a corrupt model (bytes changed after the digest was taken) and a mismatched one: refused,
        # old one serves
        good = tiny_onnx(30)
        corrupt = bytearray(good)
        corrupt[-20] ^= 0xFF
        messages = {
            "d02": encode_command(
                deploy_command(FLEET, "d02", good, version="v3"), bytes(corrupt)
            ),  # the good model's digest
            "d00": encode_command(
                deploy_command(FLEET, "d00", tiny_onnx(31, side=5), version="v3"),
                tiny_onnx(31, side=5),
            ),
        }
        reports = publish_commands(
            BrokerAddress.parse(url("ops")),
            FLEET,
            messages,
            wait=scaled(60),
            expect={"d02": "v3", "d00": "v3"},
        )
        assert "digest mismatch" in reports["d02"]["error"] and reports["d02"]["version"] == "v2"
        assert "[1, 5, 5]" in reports["d00"]["error"] and reports["d00"]["version"] == "v2"
        assert ModelStore(stores["d02"]).active_path().read_bytes() == tiny_onnx(20)

        # `edgefl infer` with no model runs the active one
        np.save(tmp_path / "x.npy", np.random.default_rng(0).random((2, 1, 4, 4), dtype=np.float32))
        out = json.loads(
            cli(
                "infer", str(tmp_path / "x.npy"), "--models-dir", str(stores["d02"]), "--json"
            ).stdout
        )
        assert out["model"].endswith("v2.onnx") and len(out["predictions"]) == 2

        # fleet status shows each device's active version (and the refusal)
        status = json.loads(cli("fleet", "status", "--json", *ops).stdout)
        assert {d: status["devices"][d]["model_version"] for d in devices} == {
            "d00": "v2",
            "d01": "v1",
            "d02": "v2",
        }
        assert "digest mismatch" in status["devices"]["d02"]["model_error"]
    finally:
        for a in agents:
            a.terminate()
            a.wait(scaled(20))
        broker.stop()
    assert [a.returncode for a in agents] == [0, 0, 0]
