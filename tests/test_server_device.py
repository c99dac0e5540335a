"""Server and device processes over real brokers (embedded amqtt and Mosquitto).

- the same aggregate as the in-memory simulation for the same seed (FedAvg; FedProto; FedHeNN
  with devices holding the public pool), in chunks too.

Faults (a device killed, the broker restarted, the server killed; malformed messages):
tests/test_server_device_faults.py. The helpers both use: tests/server_device_cases.py.
"""

import json
from pathlib import Path

import pytest

from edgefl.runtime import simulation
from edgefl.runtime.server import ServeOptions
from edgefl.transport.broker import EmbeddedBroker, MosquittoBroker
from tests.commands import simulated_tier
from tests.conftest import scaled, tiny_config
from tests.needs import need_mosquitto
from tests.server_device_cases import (
    assert_same_state,
    finish,
    serve_in_thread,
    spawn,
)

pytestmark = pytest.mark.slow


# --- the same aggregate as in memory
# ------------------------------------------------------------------


# FedProto: a knowledge method (prototypes; its CNNs draw dropout masks from torch's generator,
# which the agent seeds per device and round); FedHeNN with rad_source=device: devices that
# also hold the server's pool; FedAvg with every model in chunks (server and device processes
# read EDGEFL_CHUNK_* from the environment).
@pytest.mark.parametrize(("broker_kind", "algorithm", "options", "chunked"), [
    ("amqtt", "fedavg", {}, False),
    ("mosquitto", "fedproto", {}, False),
    ("amqtt", "fedhenn", {"rad_source": "device", "rad_size": "20"}, False),
    ("mosquitto", "fedavg", {}, True),
])
def test_mqtt_run_matches_the_in_memory_simulation(
    tmp_path, profile_file, monkeypatch, broker_kind, algorithm, options, chunked
):
    # Prepare: the in-memory reference, capturing its server half
    # one torch thread, as each device process runs: the same floating-point reductions
    # every device every round (fraction 1); the server starts when all 3 are ready (--min-devices)
    cfg = tiny_config(
        tmp_path, algorithm=algorithm, rounds=2, clients=3, options=options, threads=1, fraction=1.0
    )
    captured = []
    reference = simulation.simulate(
        cfg.model_copy(update={"run_name": "memory"}),
        on_done=lambda s: captured.append(s.state_dict()),
    )
    expected = captured[0]
    if chunked:  # models of ~60 kB in chunks of 8 kB
        monkeypatch.setenv("EDGEFL_CHUNK_THRESHOLD", "20000")
        monkeypatch.setenv("EDGEFL_CHUNK_SIZE", "8000")

    if broker_kind == "mosquitto":
        need_mosquitto()
        broker = MosquittoBroker(port=0, workdir=tmp_path / "mosq").start()
    else:
        broker = EmbeddedBroker(port=0).start()
    fleet = f"eq-{broker_kind}{'-chunks' if chunked else ''}"
    try:
        # Execute: server in this process, three device processes
        t, box = serve_in_thread(
            cfg.model_copy(update={"min_devices": 3, "run_name": "mqtt"}),
            ServeOptions(broker=broker.url, fleet=fleet, deadline=scaled(60)),
        )
        # devices forked from the fork server `simulate --transport mqtt` uses (spawn): each gets
        # the environment of when it starts, so the chunked case's see the chunk settings set here
        # after that server started
        procs = [
            # each device the tier `simulate --transport mqtt` gives it
            spawn(broker.url, fleet, cfg, i, tmp_path, profile_file, tier=simulated_tier(cfg, i))
            for i in range(3)
        ]
        codes = finish(procs, server=t)
    finally:
        broker.stop()

    # Assert
    assert "error" not in box, box.get("error")
    assert codes == [0, 0, 0]  # devices left by themselves when the run was over
    assert_same_state(box["state"], expected)
    assert box["summary"]["client_accuracy"] == pytest.approx(reference["client_accuracy"])
    rounds = [
        json.loads(line)
        for line in (Path(box["summary"]["run_dir"]) / "rounds.jsonl").read_text().splitlines()
    ]
    assert [r["completed"] for r in rounds] == [["d00", "d01", "d02"]] * 2
    # traffic accounting: what the transport published is what the round records, counted once
    # (the evaluation's downlink is not re-sent to train on, and counts with the round)
    assert rounds[1]["downlinks_not_resent"] == ["d00", "d01", "d02"]
    for r in rounds:
        for d in r["selected"]:
            recorded = r["bytes_down"][d] + r.get("eval_bytes_down", {}).get(d, 0)
            published = r["transport"]["published_down"][d]
            assert (
                published == recorded
                if not r["transport"]["retries"].get(d)
                else published > recorded
            )
        assert r["bytes_down_total"] == sum(r["bytes_down"].values()) + sum(
            r.get("eval_bytes_down", {}).values()
        )
    sent, received = box["transport"].chunker.stats, box["transport"].reassembly.stats
    if chunked:  # the models went in chunks both ways, nothing twice
        assert (
            sent.messages >= 6
            and received.completed >= 6
            and sent.resent == 0
            and received.duplicates == 0
        )
        assert all(not r["transport"]["retries"] for r in rounds)
    else:
        assert sent.messages == 0 and received.completed == 0


# --- failures: a device, the broker, the server
# -------------------------------------------------------


# --- hostile messages
# ----------------------------------------------------------------------------------

