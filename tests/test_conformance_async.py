"""The conformance suite for asynchronous buffered aggregation (FedBuff, ``--aggregation async``):
the same fleet and seed in memory (simulated time, edgefl.runtime.buffered) and over the embedded
broker (real time, edgefl.runtime.live) with the device side built by the device process's own
code (``DeviceRuntime``), for every method that declares it can run asynchronously.

Arrival order over MQTT depends on the machine, so the two runs are not compared number for
number (the synchronous suite does that, tests/test_conformance.py): both must aggregate K
updates per round, one per device, record each update's staleness and weight, use a stale update
(with 3 devices and K = 2 the second aggregation always holds one trained on the first model),
and end with finite models and accuracies for every device. A device that sends an update naming
a model version it was not sent (one from the future, or an earlier one) is refused with a
logged reason, counted in the round's ``rejected``, and the run goes on.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest

from edgefl.algorithms import get_algorithm
from edgefl.runtime.device import DeviceRuntime
from edgefl.runtime.simulation import simulate
from edgefl.transport.broker import EmbeddedBroker
from edgefl.wire import decode, encode
from tests.conformance_cases import conformance_config
from tests.conftest import scaled
from tests.test_conformance import mqtt_fleet


def async_methods() -> list[str]:
    from edgefl.algorithms import algorithm_names

    out = []
    for name in algorithm_names():
        algorithm = get_algorithm(name)
        if algorithm.needs_for(algorithm.parse_options({})).asynchronous:
            out.append(name)
    return out


METHODS = async_methods()


def async_config(tmp_path: Path, name: str, run_name: str, **overrides):
    """3 devices, K = 2, 3 aggregations of 2 steps of 8 samples, per-round evaluation on."""
    settings = {"aggregation": "async", "buffer": 2, "rounds": 3, "run_name": run_name}
    return conformance_config(tmp_path, name, **{**settings, **overrides})


def read_rounds(summary: dict) -> list[dict]:
    return [
        json.loads(line)
        for line in (Path(summary["run_dir"]) / "rounds.jsonl").read_text().splitlines()
    ]


def assert_buffered(rounds: list[dict], summary: dict, devices: list[str], k: int) -> None:
    """K updates per aggregation, one per device, staleness and weights recorded, one stale
    update used, finite results for every device."""
    assert len(rounds) == 3
    for r in rounds:
        staleness = r["buffered"]["staleness"]
        assert sorted(staleness) == sorted(r["completed"]) and len(staleness) == k, r["round"]
        assert all(0 <= t < r["round"] for t in staleness.values()), r["round"]
        for d, t in staleness.items():
            assert r["buffered"]["staleness_weight"][d] == pytest.approx(1 / math.sqrt(1 + t))
    assert any(t >= 1 for r in rounds for t in r["buffered"]["staleness"].values()), (
        "no stale update was used"
    )
    assert max(rounds[1]["buffered"]["staleness"].values()) == 1  # one trained on the first model
    assert set(summary["client_accuracy"]) == set(devices)
    assert all(0.0 <= a <= 1.0 for a in summary["client_accuracy"].values())
    assert summary["finish_failed"] == {}


def test_a_stale_delta_is_scaled_by_its_staleness_weight_by_hand():
    from edgefl.runtime.buffered import rebase
    from edgefl.wire import Payload

    # Prepare: HeteroFL's shape of update: deltas (d/) against the sub-model (w/) it was sent
    received = Payload({"w/a": np.array([1.0, 2.0], np.float32)})
    current = Payload({"w/a": np.array([5.0, 5.0], np.float32)})
    deltas = {"d/a": np.array([0.4, -0.8], np.float32), "d/n": np.array(3)}
    update = Payload(deltas, {"num_samples": 4})
    # Execute: staleness 3, s = 1/√4 = 0.5
    out = rebase(update, received, current, 3, ("d/",))
    # Assert: the change scaled, integer arrays and metadata as sent; nothing rebased by name
    np.testing.assert_allclose(out.arrays["d/a"], [0.2, -0.4])
    assert out.arrays["d/n"] == 3 and out.meta == {"num_samples": 4}
    assert set(out.arrays) == {"d/a", "d/n"}
    assert rebase(update, received, current, 0, ("d/",)) is update


@pytest.fixture(scope="module")
def broker():
    b = EmbeddedBroker(port=0).start()
    yield b
    b.stop()


def finite_state(state: dict) -> bool:
    return all(np.isfinite(np.asarray(v, np.float64)).all() for v in state.values())


@pytest.mark.slow
@pytest.mark.parametrize("name", METHODS)
def test_memory_and_mqtt_aggregate_k_arrivals_with_their_staleness(
    tmp_path, broker, monkeypatch, name
):
    # Prepare / Execute: in memory (simulated time), then over MQTT (real time)
    memory_box, mqtt_box = {}, {}
    cfg = async_config(tmp_path, name, "memory")
    memory = simulate(
        cfg, plots=False, on_done=lambda s: memory_box.__setitem__("state", s.state_dict())
    )
    mqtt_cfg = async_config(tmp_path, name, "mqtt")
    run, runtimes, serve_run = mqtt_fleet(mqtt_cfg, broker, f"async-{name}", monkeypatch)
    mqtt = serve_run(on_done=lambda s: mqtt_box.__setitem__("state", s.state_dict()))

    # Assert: both ways, K arrivals per aggregation with their staleness, a stale one used
    assert_buffered(read_rounds(memory), memory, run.ids, 2)
    rounds = read_rounds(mqtt)
    assert_buffered(rounds, mqtt, run.ids, 2)
    assert finite_state(memory_box["state"]) and finite_state(mqtt_box["state"])
    assert set(memory_box["state"]) == set(mqtt_box["state"])  # the same server state, by name
    for r in runtimes:
        model = r.agent.half.model.state_dict()
        assert all(
            np.isfinite(v.detach().numpy()).all() for v in model.values() if v.is_floating_point()
        )
    # over MQTT the clock is seconds of wall time; every update in flight at the end was not used
    clocks = [r["buffered"]["clock"] for r in rounds]
    assert clocks == sorted(clocks) and clocks[0] > 0
    assert all(r["rejected"] == {} and r["failed"] == {} for r in rounds)


class ForgingRuntime(DeviceRuntime):
    """A device that sends, before its first update trained on a model after the first
    aggregation, two copies of it naming another model version: one from the future (+5), and
    one it was not sent (−1, with its request's nonce). Both are real envelopes (valid on the
    wire, their own message ids); only the version is wrong."""

    def __init__(self, opts):
        super().__init__(opts)
        self.forged: list[int] = []  # the versions it named

    def _build(self, a):
        super()._build(a)
        endpoint, runtime = self.endpoint, self
        reply = endpoint.reply

        def forging_reply(request, data):
            env = decode(data)
            if env.kind == "update" and env.round >= 1 and not runtime.forged:
                for i, shift in enumerate((5, -1)):
                    runtime.forged.append(env.round + shift)
                    fake = dataclasses.replace(
                        env, round=env.round + shift, message_id=f"{env.message_id[:-4]}bee{i}"
                    )
                    endpoint.send("up", encode(fake))  # the same client and topic: it arrives first
            reply(request, data)

        endpoint.reply = forging_reply


@pytest.mark.slow
def test_an_update_naming_a_version_it_was_not_sent_is_refused_and_the_run_goes_on(
    tmp_path, broker, monkeypatch, caplog
):
    # Prepare: d00 forges the version of an update
    cfg = async_config(tmp_path, "fedavg", "forged", rounds=5)
    run, runtimes, serve_run = mqtt_fleet(cfg, broker, "async-forged", monkeypatch)
    forger = runtimes[0] = ForgingRuntime(runtimes[0].opts)
    caplog.set_level(logging.WARNING, logger="edgefl.transport.mqtt.server")

    # Execute
    summary = serve_run()

    # Assert: both forgeries refused with the reason logged and counted, the real updates used
    rounds = read_rounds(summary)
    assert len(forger.forged) == 2
    refusals = [m for m in caplog.messages if "refused a update from d00" in m]
    assert any("a version from the future" in m for m in refusals), caplog.messages
    assert any("a version it was not sent" in m for m in refusals), caplog.messages
    assert sum(r["rejected"].get("d00", 0) for r in rounds) == 2
    assert len(rounds) == 5 and all(len(r["completed"]) == 2 for r in rounds)
    assert any("d00" in r["completed"] for r in rounds)  # its real updates were aggregated
    assert set(summary["client_accuracy"]) == set(run.ids)


def test_in_memory_an_update_naming_another_version_is_refused_and_the_run_goes_on(tmp_path):
    from edgefl.transport import InMemoryTransport

    # Prepare: d00 answers its second request with an update naming a version from the future
    cfg = async_config(tmp_path, "fedavg", "forged-memory", rounds=4, eval_every=0)
    calls = {"n": 0}
    connect = InMemoryTransport.connect

    def forging_connect(self, device_id, handler):
        if device_id != "d00":
            return connect(self, device_id, handler)

        def forging(request):
            reply = handler(request)
            calls["n"] += 1
            if calls["n"] == 2 and reply.kind == "update":
                return dataclasses.replace(reply, round=reply.round + 5)
            return reply

        return connect(self, device_id, forging)

    # Execute
    with pytest.MonkeyPatch.context() as m:
        m.setattr(InMemoryTransport, "connect", forging_connect)
        summary = simulate(cfg, plots=False)

    # Assert: refused (the device's dispatch failed, it pulls again), the run completed
    rounds = read_rounds(summary)
    refused = [r for r in rounds if r["rejected"].get("d00")]
    assert len(refused) == 1 and "a version from the future" in refused[0]["failed"]["d00"]
    assert len(rounds) == 4 and all(len(r["buffered"]["staleness"]) == 2 for r in rounds)
    assert summary["mean_accuracy"] is not None and math.isfinite(summary["mean_accuracy"])


@pytest.mark.slow
def test_the_cli_runs_fedbuff_over_mqtt_with_device_processes(tmp_path):
    import os
    import subprocess
    import sys

    # Prepare: the command of the docs, on a tiny fleet: a broker, this server, 3 device processes
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k not in ("EDGEFL_BROKER", "EDGEFL_CONFIG")}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    command = [
        sys.executable, "-m", "edgefl.cli.main", "simulate", "--algorithm", "fedavg",
        "--aggregation", "async", "--buffer", "2", "--transport", "mqtt", "--dataset", "synthetic",
        "--clients", "3", "--rounds", "3", "--steps", "2", "--width", "0.25",
        "--train-samples", "300", "--test-samples", "50", "--eval-samples", "50",
        "--out", str(tmp_path), "--run-name", "cli", "--quiet", "--json",
    ]  # fmt: skip

    # Execute
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=scaled(600))

    # Assert: every aggregation holds 2 updates with their staleness; every device's model saved
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert summary["transport"] == "mqtt" and summary["device_processes"] == 3
    rounds = read_rounds(summary)
    assert [len(r["buffered"]["staleness"]) for r in rounds] == [2, 2, 2]
    assert max(rounds[1]["buffered"]["staleness"].values()) == 1
    assert summary["mean_accuracy"] is not None and math.isfinite(summary["mean_accuracy"])
    saved = sorted(p.name for p in (tmp_path / "cli" / "models").glob("*.safetensors"))
    assert saved == ["d00.safetensors", "d01.safetensors", "d02.safetensors"]
