"""Secure aggregation over MQTT: a server and four device processes on a real Mosquitto broker run
FedAvg with ``secagg=on`` on a 2-regular neighbour graph (SecAgg+: each device masks with and
shares among 2 of the other 3; every stage a train request and its update reply in the one message
shape, each validated on arrival), and end with the global model of the same run in memory."""

import json
from pathlib import Path

import pytest

from edgefl.runtime import simulation
from edgefl.runtime.server import ServeOptions
from edgefl.transport.broker import MosquittoBroker
from tests.commands import simulated_tier
from tests.conftest import scaled, tiny_config
from tests.needs import need_mosquitto
from tests.server_device_cases import assert_same_state, finish, serve_in_thread, spawn

pytestmark = pytest.mark.slow


def test_fedavg_with_secagg_over_mosquitto_matches_the_in_memory_run(
    tmp_path,
    profile_file,  # noqa: F811
):
    need_mosquitto()
    cfg = tiny_config(
        tmp_path,
        algorithm="fedavg",
        rounds=2,
        clients=4,
        options={"secagg": "on", "secagg_neighbours": "2"},
        threads=1,
        fraction=1.0,
    )
    captured = []
    simulation.simulate(
        cfg.model_copy(update={"run_name": "memory"}),
        on_done=lambda s: captured.append(s.state_dict()),
    )
    expected = captured[0]

    broker = MosquittoBroker(port=0, workdir=tmp_path / "mosq").start()
    try:
        t, box = serve_in_thread(
            cfg.model_copy(update={"min_devices": 4, "run_name": "mqtt"}),
            ServeOptions(broker=broker.url, fleet="secagg", deadline=scaled(60)),
        )
        procs = [
            spawn(broker.url, "secagg", cfg, i, tmp_path, profile_file, tier=simulated_tier(cfg, i))
            for i in range(4)
        ]
        codes = finish(procs, server=t)
    finally:
        broker.stop()

    assert "error" not in box, box.get("error")
    assert codes == [0, 0, 0, 0]
    # the unmasked sum is exact in the ring: the same model as in memory
    assert_same_state(box["state"], expected)
    rounds = [
        json.loads(line)
        for line in (Path(box["summary"]["run_dir"]) / "rounds.jsonl").read_text().splitlines()
    ]
    for r in rounds:
        assert r["completed"] == ["d00", "d01", "d02", "d03"]
        assert not r["failed"] and not r["rejected"]
        info = r["secagg"]
        assert (info["graph"], info["neighbours"], info["threshold"]) == ("k-regular", 2, 2)
        assert info["survivors"] == 4 and info["dropped"] == []
        assert r["train_loss"] == {}  # no device's loss reaches the server
