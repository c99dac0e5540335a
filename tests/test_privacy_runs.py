"""Differential privacy in runs: a device refuses to train past its budget and a run drops it,
central DP clips each update and noises the mean, the ledger survives a checkpoint, and epsilon
shows in the fleet status, the dashboard and simulate's output (the mechanisms themselves:
tests/test_privacy.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgefl.privacy import PrivacySettings, Release
from edgefl.privacy.accountant import epsilon_of
from edgefl.privacy.seam import PrivacyBudgetSpent, PrivateServer
from edgefl.wire import Payload
from tests.commands import dashboard, dashboard_page, dashboard_url, flags
from tests.conftest import tiny_config
from tests.privacy_cases import STD_TOLERANCE, budgeted_run, fedavg_assembly


def test_a_device_refuses_to_train_once_its_budget_is_spent(tmp_path):
    # Prepare: a budget that pays for one round at this noise multiplier
    target = epsilon_of(4.0, 1, 1e-5) * 1.0001
    run, fleet = fedavg_assembly(
        tmp_path, dp="local", dp_target_epsilon=target, dp_noise_multiplier=4.0
    )
    half = run.device_half("d00")
    from edgefl.runtime.setup import build_server

    server = build_server(run.method, run.server_context(fleet))
    half.receive(0, server.downlink(0, "d00"))
    # Execute / Assert: round 0 trains and spends; round 1 is refused
    up = half.fit(0)
    assert up.meta["dp_epsilon"] == pytest.approx(epsilon_of(4.0, 1, 1e-5))
    with pytest.raises(PrivacyBudgetSpent, match="budget spent"):
        half.fit(1)


def test_a_run_drops_the_devices_that_spent_their_budget(tmp_path):
    # Prepare: 4 rounds, a budget that pays for 2 of them
    z = 3.0
    target = epsilon_of(z, 2, 1e-5) * 1.0001
    # Execute
    summary, rounds = budgeted_run(tmp_path, "local", z, target)
    # Assert: every device trains in rounds 0 and 1, none after; ε never exceeds the target
    assert [len(r["selected"]) for r in rounds] == [3, 3, 0, 0]
    assert all(not r["failed"] for r in rounds)
    assert summary["privacy"]["budget_spent"] == ["d00", "d01", "d02"]
    assert max(summary["privacy"]["epsilon"].values()) <= target
    assert rounds[1]["device_metrics"]["d00"]["dp_epsilon"] == pytest.approx(epsilon_of(z, 2, 1e-5))


class AveragingServer:
    """A global-model server stand-in of one array: the mean of the uplinks, state = weights."""

    def __init__(self, ctx):
        self.ctx, self.options, self.weights = ctx, None, {"w/a": np.zeros(50_000, np.float32)}

    def aggregate(self, round, uplinks):
        assert {p.meta["num_samples"] for p in uplinks.values()} == {1}  # equal weights
        self.weights = {
            "w/a": np.mean([p.arrays["w/a"] for p in uplinks.values()], axis=0).astype(np.float32)
        }
        return {}

    def state_dict(self):
        return dict(self.weights)

    def load_state_dict(self, arrays):
        self.weights = {"w/a": np.array(arrays["w/a"])}

    def select(self, round, ids, rng):
        return list(ids)


def central_server(devices, rounds, **privacy) -> PrivateServer:
    """Central DP (``privacy``: the PrivacySettings) on an :class:`AveragingServer` of the
    ``devices`` (ids) over ``rounds`` rounds."""
    from edgefl.algorithms import ServerContext, TrainSettings

    fleet, train = dict.fromkeys(devices), TrainSettings()
    ctx = ServerContext(num_classes=10, fleet=fleet, settings=train, rounds=rounds, seed=0)
    dp = PrivacySettings(mode="central", **privacy)
    return PrivateServer(AveragingServer(ctx), dp, Release(whole=("w/",)), rounds=rounds)


def test_central_dp_clips_each_update_and_noises_the_mean_at_the_calibrated_std():
    # Prepare: 4 devices; one sends an enormous update
    server = central_server("abcd", 5, target_epsilon=8, clip=1.0, noise_multiplier=1.5)
    direction = np.zeros(50_000, np.float32)
    direction[0] = 1
    uplinks = {
        d: Payload({"w/a": direction * (1e6 if d == "a" else 0.5)}, {"num_samples": 100})
        for d in "abcd"
    }
    # Execute
    metrics = server.aggregate(0, uplinks)
    # Assert: coordinate 0 holds the mean of the clipped updates (1 and three 0.5) plus noise; the
    # rest is noise of std z·C/n
    w = server.state_dict()["w/a"].astype(np.float64)
    std = 1.5 * 1.0 / 4
    assert abs(w[1:].std() / std - 1) < STD_TOLERANCE
    assert abs(w[0] - (1 + 3 * 0.5) / 4) < 5 * std
    assert metrics["dp_clip"] == 1.0


def test_adaptive_clipping_moves_the_clip_toward_the_update_norms():
    devices = [f"d{i}" for i in range(100)]
    server = central_server(
        devices, 30, target_epsilon=8, clip=1.0, noise_multiplier=0.5, adaptive_quantile=0.5
    )
    # part of the noise budget pays for the count
    assert server.update_noise > server.noise_multiplier
    norms = np.linspace(0.01, 0.1, 100)  # every update far below the starting clip
    for r in range(30):
        w = server.state_dict()["w/a"]
        ups = {
            f"d{i}": Payload({"w/a": w + np.float32(n / math.sqrt(50_000))}, {"num_samples": 1})
            for i, n in enumerate(norms)
        }
        server.aggregate(r, ups)
    assert 0.02 < server.clip < 0.3  # from 1.0 toward the median norm, 0.055


#: A round record of a private run (local DP, budget 8): d00 has spent ε 3.25, d01 nothing.
PRIVATE_ROUND = {
    "round": 0,
    "completed": ["d00"],
    "privacy": {"mode": "local", "target_epsilon": 8.0, "delta": 1e-5,
                "epsilon": {"d00": 3.25, "d01": 0.0}},
}


def private_fleet_status():
    """The fleet status of Felo's devices d00 and d01, registered, before any round."""
    from edgefl.runtime.status import FleetStatus

    s = FleetStatus("lab", run_name="r", algorithm="felo", rounds=3)
    for d in ("d00", "d01"):
        s.registered(d, "10", "resnet10", {})
    return s


def test_fleet_status_shows_the_epsilon_each_device_has_spent(capsys):
    # Prepare: a fleet status fed one round record of a private run
    import json

    from edgefl.cli.fleet import render

    s = private_fleet_status()
    # Execute
    s.round_recorded(PRIVATE_ROUND)
    snapshot = json.loads(json.dumps(s.snapshot()))
    render(snapshot)
    # Assert: ε per device in the snapshot and on the screen, with the budget
    assert snapshot["devices"]["d00"]["epsilon"] == 3.25
    assert snapshot["server"]["privacy"] == {"mode": "local", "target_epsilon": 8.0, "delta": 1e-5}
    text = capsys.readouterr().out
    assert "budget ε 8.0 at δ 1e-05" in text and "3.25" in text and "ε spent" in text


def test_the_ledger_and_the_adaptive_clip_survive_a_checkpoint():
    # Prepare: a central-DP server after one round with adaptive clipping
    devices = [f"d{i}" for i in range(40)]
    privacy = dict(target_epsilon=100, clip=1.0, noise_multiplier=0.5, adaptive_quantile=0.5)
    server = central_server(devices, 5, **privacy)
    selected = server.select(0, sorted(devices), np.random.default_rng(0))
    server.aggregate(
        0,
        {
            d: Payload({"w/a": np.full(50_000, 1e-4, np.float32)}, {"num_samples": 1})
            for d in selected
        },
    )
    # Execute: a new server from the checkpointed state
    restored = central_server(devices, 5, **privacy)
    restored.load_state_dict(server.state_dict())
    # Assert: the same ledger, clip and model
    assert restored.ledger.counts == server.ledger.counts == dict.fromkeys(selected, 1)
    assert restored.clip == server.clip != 1.0
    np.testing.assert_array_equal(restored.state_dict()["w/a"], server.state_dict()["w/a"])


@pytest.mark.slow
def test_local_dp_over_mqtt_releases_what_it_releases_in_memory(tmp_path):
    # Prepare: Felo with local DP on a tiny fleet; the noise is seeded per device and round
    from edgefl.runtime.fleet import simulate_mqtt
    from edgefl.runtime.simulation import simulate

    options = {"dp": "local", "dp_target_epsilon": "8", "dp_clip": "5"}
    cfg = tiny_config(tmp_path, algorithm="felo", options=options, threads=1, eval_every=0)
    # Execute
    memory = simulate(cfg.model_copy(update={"run_name": "memory"}), plots=False)
    mqtt = simulate_mqtt(cfg.model_copy(update={"run_name": "mqtt"}), deadline=240)
    # Assert: every device spent the budget, and the same releases led to the same models
    assert mqtt["privacy"]["epsilon"] == memory["privacy"]["epsilon"]
    assert max(mqtt["privacy"]["epsilon"].values()) == pytest.approx(8.0, rel=1e-3)
    assert mqtt["client_accuracy"] == pytest.approx(memory["client_accuracy"], abs=1e-6)


@pytest.mark.slow
def test_the_dashboard_shows_the_epsilon_each_device_has_spent(tmp_path):
    # Prepare: a run directory whose status holds one private round; the dashboard following it
    import json

    from tests.test_fleet_live import launch_browser

    try:
        from playwright.sync_api import sync_playwright
    except ImportError as e:
        pytest.fail(f"playwright is not installed (it is in the [dev] extra): {e}")
    s = private_fleet_status()
    s.round_recorded(PRIVATE_ROUND)
    (tmp_path / "status.json").write_text(json.dumps(s.snapshot()))
    dash = dashboard("--run", str(tmp_path))
    try:
        page_url = dashboard_url(dash)
        with sync_playwright() as p:
            browser = launch_browser(p)
            try:
                page = dashboard_page(browser)
                page.goto(page_url)
                # Execute: wait for the status to be drawn
                page.wait_for_selector("#privacy >> text=/ε spent/", timeout=60_000)
                text = page.text_content("#privacy")
            finally:
                browser.close()
    finally:
        dash.terminate()
        dash.wait(30)
    # Assert: the mode, the budget and every device's ε
    assert (
        text
        == "Differential privacy (local), budget ε 8 at δ 0.00001 per device; ε spent: d00 3.25, "
        "d01 0.00"
    )


def test_simulate_prints_epsilon_per_device_per_round_and_stops_at_the_target(tmp_path):
    # Prepare: the CLI, Felo with local DP on a tiny synthetic fleet
    from typer.testing import CliRunner

    from edgefl.cli.main import app

    args = [
        "simulate",
        *flags(algorithm="felo", dp="local", target_epsilon=8, delta="1e-5", clip=5,
               dataset="synthetic", clients=3, rounds=2, steps=2, train_samples=600,
               test_samples=100, eval_samples=100, width=0.25, out=tmp_path, run_name="r"),
    ]
    # Execute
    result = CliRunner().invoke(app, args)
    # Assert: one ε line per round naming every device; the last at the target
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.strip().startswith("ε ")]
    assert len(lines) == 2 and all(all(d in line for d in ("d00", "d01", "d02")) for line in lines)
    assert "d00 8.00" in lines[-1] and "(target 8)" in lines[-1]


def test_privacy_noise_comes_from_the_process_own_entropy_unless_a_simulation_repeats(
    tmp_path, monkeypatch
):
    """Noise drawn from the run seed could be regenerated and subtracted by whoever knows the seed
    (the server assigns it; config.json records it). A device process and the MQTT server draw it
    from their own entropy; only the simulations, which must repeat, draw it from the seed."""
    from edgefl.algorithms import DeviceRecord, TrainSettings
    from edgefl.models import ModelSpec
    from edgefl.privacy.declare import REPEATABLE_NOISE_ENV
    from edgefl.privacy.seam import noise_rng
    from edgefl.runtime.assignment import Assignment, build_assigned
    from edgefl.runtime.dataspec import DataSpec
    from edgefl.runtime.setup import assemble, build_server, resolve_method

    assert (
        noise_rng([1, 2, 3]).normal(size=4).tolist() == noise_rng([1, 2, 3]).normal(size=4).tolist()
    )
    assert noise_rng(None).normal(size=4).tolist() != noise_rng(None).normal(size=4).tolist()

    options = {"dp": "local", "dp_target_epsilon": "8", "dp_clip": "1"}
    spec = ModelSpec(family="cnn", tier="2", num_classes=10, in_shape=(1, 28, 28), width=0.25)
    a = Assignment(spec, "fedavg", options, TrainSettings(steps=2), 3, 0, 0.0, "e1", True)
    monkeypatch.delenv(REPEATABLE_NOISE_ENV, raising=False)
    device, _ = build_assigned(DataSpec.parse("synthetic:shard=0/2"), a, "d00")
    up = device.inner.fit(1).arrays
    releases = [device.protect(up, 1) for _ in range(2)]
    assert device.repeatable is False
    # fresh noise each time
    assert any(not np.array_equal(releases[0][k], releases[1][k]) for k in up)
    monkeypatch.setenv(REPEATABLE_NOISE_ENV, "1")  # a device process a simulation started
    device, _ = build_assigned(DataSpec.parse("synthetic:shard=0/2"), a, "d00")
    assert device.repeatable is True
    releases = [device.protect(up, 1) for _ in range(2)]
    assert all(np.array_equal(releases[0][k], releases[1][k]) for k in up)

    cfg = tiny_config(tmp_path, algorithm="fedavg", options={**options, "dp": "central"})
    run = assemble(cfg)  # the in-memory simulation
    ctx = run.server_context({d: DeviceRecord(spec=run.specs[d], num_samples=10) for d in run.ids})
    assert run.method.repeatable_noise and build_server(run.method, ctx).repeatable is True
    method = resolve_method("fedavg", {**options, "dp": "central"})  # what `server start` resolves
    assert method.repeatable_noise is False
    assert build_server(method, ctx).repeatable is False

