"""The conformance suite: every registered method passes every check here by being registered.

Parametrized over the method registry (as torchvision's model tests are), on tiny synthetic data,
2 rounds, 3 devices and each method's smallest default models (tests/conformance_cases.py); the
wire, ONNX and privacy checks are in tests/test_conformance_checks.py:

- memory ≡ MQTT: the same seed gives the same server state and device models (within 1e-6) in
  memory and over the embedded broker, with the device side built by the device process's own
  code (``DeviceRuntime``: registration, assignment, the run assembly), one torch thread each;
- checkpoint → resume: a run interrupted after round 1 and resumed from its checkpoint by a new
  server ends in the same state as an uninterrupted run;
- the bytes each round records are the bytes the MQTT transport published and received.

Device processes are threads of the test process here (one broker for the module): their local
work is serialised by a lock, because torch's generator, which the agent seeds per device and
round, is process-wide. The MQTT cases carry the ``slow`` marker; CI runs them too
(``make test`` deselects nothing).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from edgefl.runtime import agent as agent_module
from edgefl.runtime import device as device_module
from edgefl.runtime.dataspec import DataSpec
from edgefl.runtime.device import DeviceOptions, DeviceRuntime
from edgefl.runtime.exchange import LoopSettings
from edgefl.runtime.fleet import SIMULATED_PROFILE
from edgefl.runtime.loop import RoundLoop
from edgefl.runtime.server import ServeOptions, serve
from edgefl.runtime.setup import assemble
from edgefl.runtime.simulation import simulate
from edgefl.transport.broker import EmbeddedBroker
from tests.conformance_cases import (  # noqa: F401 (_restore_torch_threads: autouse)
    METHODS,
    _restore_torch_threads,
    conformance_config,
    memory_fleet,
)
from tests.conftest import scaled

TOLERANCE = 1e-6


def assert_states_equal(got: dict, expected: dict, what: str) -> None:
    assert set(got) == set(expected), f"{what}: keys differ: {sorted(set(got) ^ set(expected))[:5]}"
    for k in expected:
        a, b = np.asarray(got[k]), np.asarray(expected[k])
        assert a.shape == b.shape, f"{what} {k}: shape {a.shape} != {b.shape}"
        np.testing.assert_allclose(
            a.astype(np.float64),
            b.astype(np.float64),
            rtol=0,
            atol=TOLERANCE,
            err_msg=f"{what} {k}",
        )


def model_arrays(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


# --- memory ≡ MQTT, and declared bytes = sent bytes
# ------------------------------------------------


@pytest.fixture(scope="module")
def broker():
    b = EmbeddedBroker(port=0).start()
    yield b
    b.stop()


def mqtt_fleet(cfg, broker, fleet: str, monkeypatch, runtime=DeviceRuntime):
    """The devices of ``cfg`` as DeviceRuntime threads (their local work serialised: torch's
    generator is process-wide) and a function that serves the run and joins them."""
    lock = threading.RLock()
    build, handle = device_module.build_assigned, agent_module.DeviceAgent.handle_bytes

    def locked_build(*a, **k):
        with lock:
            return build(*a, **k)

    def locked_handle(self, data):
        with lock:
            return handle(self, data)

    monkeypatch.setattr(device_module, "build_assigned", locked_build)
    monkeypatch.setattr(agent_module.DeviceAgent, "handle_bytes", locked_handle)
    run = assemble(cfg)
    runtimes = [
        runtime(
            DeviceOptions(
                broker=broker.url,
                device_id=d,
                fleet=fleet,
                data=DataSpec.from_config(cfg, i).to_string(),
                tier=run.specs[d].tier,
                profile=dict(SIMULATED_PROFILE),
                register_every=0.5,
            )
        )
        for i, d in enumerate(run.ids)
    ]

    def serve_run(**kwargs):
        threads = [
            threading.Thread(target=r.run, kwargs={"stop_after": scaled(240)}, daemon=True)
            for r in runtimes
        ]
        for t in threads:
            t.start()
        try:
            return serve(
                cfg.model_copy(update={"min_devices": len(run.ids)}),
                ServeOptions(
                    broker=broker.url,
                    fleet=fleet,
                    deadline=scaled(120),
                    wait_for_devices=scaled(120),
                ),
                **kwargs,
            )
        finally:
            for t in threads:
                t.join(scaled(60))
            assert not any(t.is_alive() for t in threads), (
                "a device did not leave when the run was over"
            )

    return run, runtimes, serve_run


def memory_run(cfg):
    """The in-memory run: (server state, {device: model arrays}, summary); no plots (the MQTT
    run of the same test draws its own)."""
    box = {}
    summary = simulate(
        cfg, plots=False, on_done=lambda s: box.__setitem__("state", s.state_dict())
    )
    run = assemble(cfg)  # the device models it saved, read back
    from edgefl.export.checkpoint import load_device_model

    models = {d: model_arrays(load_device_model(summary["run_dir"], d)) for d in run.ids}
    return box["state"], models, summary


def server_opt_cases() -> list:
    """The server optimizers (issue 39): every one on FedAvg, and FedAdam on every other method
    whose declaration says its server averages weights (Felo/Velo with two devices of one
    architecture, so that an average exists to step)."""
    from edgefl.algorithms import get_algorithm

    def averages(name: str) -> bool:
        algorithm = get_algorithm(name)
        return algorithm.needs_for(algorithm.parse_options({})).averages_weights

    same_arch = {"felo": {"tiers": ("10", "14")}, "velo": {"tiers": ("10", "14")}}
    out = [
        pytest.param("fedavg", {"server_opt": o}, id=f"fedavg-{o}")
        for o in ("fedavgm", "fedadagrad", "fedyogi", "fedadam")
    ]
    out += [
        pytest.param(m, {"server_opt": "fedadam", **same_arch.get(m, {})}, id=f"{m}-fedadam")
        for m in METHODS
        if m != "fedavg" and averages(m)
    ]
    return out


SERVER_OPT_CASES = server_opt_cases()

#: every method at its default model family, HierarchyFL's other tier family (width tiers), and
#: the server optimizers
CASES = (
    [pytest.param(m, {}, id=m) for m in METHODS]
    + [
        pytest.param(
            "hierarchyfl",
            {"model": "hierarchy-width", "tiers": ("1/8", "1/2", "1")},
            id="hierarchyfl-width",
        ),
    ]
    + SERVER_OPT_CASES
)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "family"), CASES)
def test_memory_and_mqtt_runs_agree(tmp_path, broker, monkeypatch, name, family):
    # Prepare: the in-memory reference; per-round evaluation off, so each round's transport
    # counters cover exactly the round's training exchange
    cfg = conformance_config(tmp_path, name, eval_every=0, **family)
    expected_state, expected_models, reference = memory_run(
        cfg.model_copy(update={"run_name": "memory"})
    )

    # the devices as threads, their local work serialised (torch's generator is process-wide)
    run, runtimes, serve_run = mqtt_fleet(
        cfg.model_copy(update={"run_name": "mqtt"}), broker, f"conf-{name}", monkeypatch
    )
    box: dict = {}

    # Execute: the server in this thread, the three devices in theirs (each must leave at the end)
    summary = serve_run(on_done=lambda s: box.__setitem__("state", s.state_dict()))

    # Assert: the same server state and device models
    assert_states_equal(box["state"], expected_state, "server state")
    for r in runtimes:
        assert_states_equal(
            model_arrays(r.agent.half.model),
            expected_models[r.opts.device_id],
            f"model of {r.opts.device_id}",
        )
    assert summary["client_accuracy"] == pytest.approx(reference["client_accuracy"], abs=TOLERANCE)
    # every device took its final downlink
    assert summary["finish_failed"] == reference["finish_failed"] == {}

    # and the bytes the round records declare are what the transport carried
    rounds = [
        json.loads(line)
        for line in (Path(summary["run_dir"]) / "rounds.jsonl").read_text().splitlines()
    ]
    assert [r["completed"] for r in rounds] == [run.ids] * len(rounds)
    for r in rounds:
        sent = r["transport"]
        for d in r["selected"]:
            assert sent["published_down"][d] == r["bytes_down"][d] * (
                1 + sent["retries"].get(d, 0)
            ), (r["round"], d)
            assert sent["received_up"][d] >= r["bytes_up"][d] > 0
        assert sum(sent["received_up"].values()) >= r["bytes_up_total"]
        # no re-sent request, no duplicate reply: exactly
        if not sent["dropped"] and not sent["retries"]:
            assert sum(sent["received_up"].values()) == r["bytes_up_total"]  # what was declared


# --- checkpoint → resume --------------------------------------------------------------------------


class Interrupted(Exception):
    pass


def run_loop(cfg, checkpoint_dir=None, stop_after_round=None):
    run, transport, halves, fleet = memory_fleet(cfg)
    settings = LoopSettings(
        rounds=cfg.rounds, algorithm=cfg.algorithm, eval_every=0, checkpoint_dir=checkpoint_dir
    )

    def new_loop(on_round):
        ctx = run.server_context(fleet)
        return RoundLoop(
            run.algorithm.server(ctx, run.options), ctx, transport, settings, on_round=on_round
        )

    def interrupt(record):
        if record["round"] == stop_after_round:
            raise Interrupted

    loop = new_loop(interrupt)
    if stop_after_round is not None:
        with pytest.raises(Interrupted):
            loop.run()
        loop = new_loop(lambda record: None)  # a new server, the same devices (they kept running)
        assert loop.start_round == stop_after_round  # rounds completed; records count from 1
    final = loop.run()
    return loop.server.state_dict(), {d: model_arrays(h.model) for d, h in halves.items()}, final


@pytest.mark.parametrize(
    ("name", "extra"), [pytest.param(m, {}, id=m) for m in METHODS] + SERVER_OPT_CASES
)
def test_checkpoint_then_resume_ends_where_an_uninterrupted_run_ends(tmp_path, name, extra):
    cfg = conformance_config(tmp_path, name, **extra)
    # Execute
    expected_state, expected_models, expected = run_loop(cfg)
    state, models, final = run_loop(cfg, checkpoint_dir=tmp_path / "ck", stop_after_round=1)
    # Assert
    # the optimizer stepped, and its moments are server state that resumes
    if "server_opt" in extra:
        assert any(k.startswith("opt|") for k in expected_state), sorted(expected_state)[:5]
    assert_states_equal(state, expected_state, "server state")
    for d in expected_models:
        assert_states_equal(models[d], expected_models[d], f"model of {d}")
    assert final["client_accuracy"] == pytest.approx(expected["client_accuracy"], abs=TOLERANCE)
    # every device took its final downlink
    assert final["finish_failed"] == expected["finish_failed"] == {}


# --- malformed messages
# -----------------------------------------------------------------------------


# --- export
# ------------------------------------------------------------------------------------------


# --- privacy: what each method's uplink reveals
# ----------------------------------------------------

