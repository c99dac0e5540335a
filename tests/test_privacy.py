"""Differential privacy: the noise is what its calibration says, the ledger is the library's own
composition, clipping bounds every contribution, and a run stops spending at the budget."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting import pld, rdp

from edgefl.data import ArrayDataset, dataset_info
from edgefl.errors import ConfigError
from edgefl.privacy import SENSITIVITY, ClassStats, PrivacySettings, Release, split_privacy_options
from edgefl.privacy.accountant import Ledger, adaptive_update_noise, calibrate_noise, epsilon_of
from edgefl.privacy.mechanisms import (
    PRESENT_SIGMAS,
    class_sums,
    clip_rows,
    clip_whole,
    private_class_stats,
    private_whole,
    update_norm,
)
from edgefl.privacy.seam import PrivacyBudgetSpent, PrivateServer
from edgefl.runtime.setup import resolve_method
from edgefl.wire import Payload
from tests.commands import dashboard, dashboard_page, dashboard_url, flags
from tests.conftest import tiny_config

#: Relative tolerance of an empirical standard deviation over n ≥ 200 000 draws: its relative
#: standard error is 1/√(2n) ≤ 0.16 %, so 1 % is over six standard errors.
STD_TOLERANCE = 0.01


# --- noise: its empirical standard deviation is its calibration -----------------------------------


def test_the_noise_on_a_clipped_update_has_the_calibrated_std():
    # Prepare: an update of 200 000 coordinates well inside the clip, and its reference
    rng = np.random.default_rng(1234)
    received = {"w/a": rng.normal(size=(400, 500)).astype(np.float32)}
    update = {"w/a": received["w/a"] + 1e-4}
    z, clip = 1.3, 0.7
    # Execute
    out = private_whole(update, Release(whole=("w/",)), received, clip, z, np.random.default_rng(7))
    # Assert: the noise (output minus the unclipped update, float32 rounding aside) has std z·2C
    noise = out["w/a"].astype(np.float64) - update["w/a"].astype(np.float64)
    assert out["w/a"].dtype == np.float32
    assert abs(noise.std() / (z * SENSITIVITY * clip) - 1) < STD_TOLERANCE
    assert abs(noise.mean()) < 5 * z * SENSITIVITY * clip / math.sqrt(noise.size)


def test_the_noise_on_class_sums_and_counts_has_the_calibrated_std():
    # Prepare: exact sums and counts of 10 classes × 20 000 dims; every class far above the
    # threshold
    stats = ClassStats(("feat",), reduce="sum", counts="count")
    sums = {"feat": np.zeros((10, 20_000))}
    counts = np.full(10, 1e6)
    z, clip = 0.8, 2.5
    # Execute: 50 000 draws of the counts (one call's 10 are too few to measure a std)
    dtypes = {"feat": np.float64, "count": np.float64}
    out = private_class_stats(sums, counts, stats, clip, z, np.random.default_rng(11), dtypes)
    count_noise = np.concatenate(
        [
            private_class_stats({"feat": np.zeros((10, 1))}, counts, stats, clip, z,
                                np.random.default_rng(s), {"count": np.float64})["count"]
            - 1e6
            for s in range(5000)
        ]
    )
    # Assert: sums noised with std z·2C, counts with z·2
    assert abs(out["feat"].std() / (z * SENSITIVITY * clip) - 1) < STD_TOLERANCE
    assert abs(count_noise.std() / (z * SENSITIVITY) - 1) < STD_TOLERANCE


def test_a_class_reported_absent_carries_no_row_and_no_count():
    # Prepare: class 0 held by 1000 samples, class 1 by none
    stats = ClassStats(("proto",), reduce="mean", classes="proto_classes")
    sums = {"proto": np.array([[1000.0, 0.0], [0.0, 0.0]])}
    # Execute
    out = private_class_stats(
        sums, np.array([1000.0, 0.0]), stats, 1.0, 1e-3, np.random.default_rng(0), {}
    )
    # Assert: only class 0 reported, its mean close to the true mean
    assert out["proto_classes"].tolist() == [0]
    np.testing.assert_allclose(out["proto"], [[1.0, 0.0]], atol=1e-4)
    assert PRESENT_SIGMAS * 1e-3 * SENSITIVITY < 1  # (the threshold is then 1 sample)


def test_noisy_class_means_are_projected_onto_the_clip_ball_never_farther_from_the_truth():
    # Prepare: two blocks of per-sample vectors clipped to C, their exact per-class sums, and noise
    # far larger than the means (z = 20: the mean of 30 samples is mostly noise)
    rng = np.random.default_rng(5)
    stats = ClassStats(("logit", "feat"), reduce="mean", counts="count")
    clip, z = 3.0, 20.0
    labels = rng.integers(0, 4, 400)
    vectors = clip_rows(rng.normal(size=(400, 64)), clip)
    sums = {"logit": np.zeros((4, 4)), "feat": np.zeros((4, 60))}
    np.add.at(sums["logit"], labels, vectors[:, :4])
    np.add.at(sums["feat"], labels, vectors[:, 4:])
    counts = np.bincount(labels, minlength=4).astype(np.float64)
    true = np.concatenate([sums["logit"], sums["feat"]], 1) / counts[:, None]
    # Execute
    dtypes = {"logit": np.float64, "feat": np.float64}
    out = private_class_stats(sums, counts, stats, clip, z, np.random.default_rng(0), dtypes)
    # Assert: every reported mean (both blocks together) within the ball, and no closer to the
    # truth without the projection (the same noise, drawn again from the same seed)
    released = np.concatenate([out["logit"], out["feat"]], 1)
    reported = out["count"] > 0
    assert reported.any()
    assert np.all(np.linalg.norm(released, axis=1) <= clip * (1 + 1e-9))
    raw_rng = np.random.default_rng(0)
    noisy_counts = counts + raw_rng.normal(0.0, z * SENSITIVITY, 4)
    raw = np.concatenate(
        [
            (sums[b] + raw_rng.normal(0.0, z * SENSITIVITY * clip, sums[b].shape))
            / np.maximum(noisy_counts, 1.0)[:, None]
            for b in ("logit", "feat")
        ],
        1,
    )
    # the noise left the ball far behind
    assert np.linalg.norm(raw[reported], axis=1).min() > 2 * clip
    for i in np.flatnonzero(reported):
        assert np.linalg.norm(released[i] - true[i]) <= np.linalg.norm(raw[i] - true[i]) + 1e-9


# --- clipping bounds every contribution
# ------------------------------------------------------------


def test_clipping_bounds_a_whole_update_and_keeps_a_small_one():
    received = {"w/a": np.zeros(3, np.float32), "w/n": np.array(7, np.int64)}
    big = {"w/a": np.array([300.0, -400.0, 0.0], np.float32), "w/n": np.array(9, np.int64)}
    small = {"w/a": np.array([0.3, 0.4, 0.0], np.float32), "w/n": np.array(9, np.int64)}
    release = Release(whole=("w/",))
    clipped = clip_whole(big, release, received, 1.0)
    assert update_norm(clipped, release, received) == pytest.approx(1.0)
    np.testing.assert_allclose(clipped["w/a"], [0.6, -0.8, 0.0])
    assert int(clipped["w/n"]) == 9  # integer arrays (step counters) are not noised or clipped
    np.testing.assert_allclose(clip_whole(small, release, received, 1.0)["w/a"], small["w/a"])


def test_clipping_bounds_every_per_class_contribution_against_an_adversarial_sample():
    # Prepare: per-sample vectors that are the images themselves (a model that leaks them), and a
    # neighbour dataset whose first image is replaced by a saturated one of another class
    info = dataset_info("synthetic")
    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, 40, (64, *info.in_shape), dtype=torch.uint8, generator=g)
    y = torch.randint(0, info.num_classes, (64,), generator=g)
    data = ArrayDataset(x, y, info)
    x2, y2 = x.clone(), y.clone()
    x2[0], y2[0] = 255, (int(y[0]) + 3) % info.num_classes
    neighbour = ArrayDataset(x2, y2, info)
    stats = ClassStats(("a", "b"), counts="count")

    def vectors(batch: torch.Tensor) -> dict[str, torch.Tensor]:
        flat = batch.flatten(1)
        return {"a": flat, "b": flat[:, :5] * 1000}

    clip = 2.0
    # Execute
    s1, n1 = class_sums(vectors, torch.nn.Identity(), data, stats, info.num_classes, clip)
    s2, n2 = class_sums(vectors, torch.nn.Identity(), neighbour, stats, info.num_classes, clip)
    # Assert: each class row moves by at most C, the whole (sums/C, counts) by at most 2
    rows = np.sqrt(sum(((s1[b] - s2[b]) ** 2).sum(1) for b in stats.blocks))
    assert rows.max() <= clip * (1 + 1e-9)
    assert np.sort(rows)[-2:].min() > 0.5 * clip  # the adversary's two classes both moved
    total = math.sqrt(
        float(sum(((s1[b] - s2[b]) ** 2).sum() for b in stats.blocks)) / clip**2
        + float(((n1 - n2) ** 2).sum())
    )
    assert total <= SENSITIVITY * (1 + 1e-9)


# --- the accountant is the library's composition
# ---------------------------------------------------


@pytest.mark.parametrize(
    ("z", "k", "delta"), [(1.0, 10, 1e-5), (2.85, 20, 1e-5), (0.7, 1, 1e-6), (5.0, 100, 1e-5)]
)
def test_the_ledger_agrees_with_the_librarys_composition_of_k_gaussian_mechanisms(z, k, delta):
    # Prepare: the library's own accountants for the Gaussian mechanism composed k times
    library = rdp.RdpAccountant()
    library.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), k))
    tight = pld.PLDAccountant()
    tight.compose(dp_accounting.GaussianDpEvent(z), k)
    rho = k / (2 * z**2)  # zCDP of k Gaussians: a closed-form upper bound
    # Execute: one device spends one mechanism per round for k rounds
    ledger = Ledger(z, delta, math.inf)
    for _ in range(k):
        ledger.spend("d00", 1)
    # Assert
    assert ledger.epsilon("d00") == pytest.approx(library.get_epsilon(delta), rel=1e-12)
    assert (
        tight.get_epsilon(delta)
        <= ledger.epsilon("d00")
        <= rho + 2 * math.sqrt(rho * math.log(1 / delta))
    )


def test_calibration_spends_the_budget_over_the_rounds_and_no_more():
    for target, count in [(1.0, 40), (4.0, 10), (8.0, 20)]:
        z = calibrate_noise(target, 1e-5, count)
        assert epsilon_of(z, count, 1e-5) <= target
        assert epsilon_of(z * 0.99, count, 1e-5) > target  # a 1 % smaller noise would overspend


def test_adaptive_clipping_splits_the_noise_as_andrew_et_al():
    z_update = adaptive_update_noise(1.0, 5.0)
    assert (z_update**-2 + (2 * 5.0) ** -2) ** -0.5 == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="count noise"):
        adaptive_update_noise(3.0, 1.0)


# --- settings and refusals
# ---------------------------------------------------------------------------


def test_privacy_options_are_split_from_the_methods_own_and_validated():
    own, s = split_privacy_options(
        {"lam": "2", "dp": "local", "dp_target_epsilon": "8", "dp_clip": "3"}
    )
    assert own == {"lam": "2"}
    assert (s.mode, s.target_epsilon, s.clip, s.delta) == ("local", 8.0, 3.0, 1e-5)
    assert split_privacy_options(s.as_options())[1] == s
    with pytest.raises(ConfigError, match="budget"):
        PrivacySettings(mode="local")
    with pytest.raises(ConfigError, match="dp_delta"):
        PrivacySettings(mode="local", target_epsilon=1, delta=2)
    with pytest.raises(ConfigError, match="central"):
        PrivacySettings(mode="local", target_epsilon=1, adaptive_quantile=0.5)


def test_central_dp_refuses_a_method_that_sends_statistics():
    with pytest.raises(ConfigError, match="dp=local"):
        resolve_method("felo", {"dp": "central", "dp_target_epsilon": "8"})
    with pytest.raises(ConfigError, match="point"):
        resolve_method("velo", {"dp": "local", "dp_target_epsilon": "8"})



def test_central_dp_refuses_a_robust_aggregator(tmp_path):
    from edgefl.runtime.setup import build_server

    run, fleet = fedavg_assembly(tmp_path, dp="central", dp_target_epsilon=8, aggregator="median")
    with pytest.raises(ConfigError, match="aggregator=mean"):
        build_server(run.method, run.server_context(fleet))


# --- the seam: a device refuses past its budget; central DP clips, averages, noises
# -------------------


def fedavg_assembly(tmp_path, **options):
    from edgefl.algorithms import DeviceRecord
    from edgefl.runtime.setup import assemble

    cfg = tiny_config(tmp_path, options={k: str(v) for k, v in options.items()})
    run = assemble(cfg)
    fleet = {d: DeviceRecord(spec=run.specs[d], num_samples=10) for d in run.ids}
    return run, fleet


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


def budgeted_run(tmp_path, mode: str, z: float, target: float) -> tuple[dict, list[dict]]:
    """A 4-round run of ``tiny_config`` with ``--dp mode``, noise multiplier ``z`` and each device's
    budget ``target``: its summary and its round records."""
    from edgefl.runtime.simulation import simulate

    budget = {"dp_target_epsilon": str(target), "dp_noise_multiplier": str(z)}
    rounds = []
    cfg = tiny_config(tmp_path, rounds=4, options={"dp": mode, **budget})
    return simulate(cfg, on_round=rounds.append, plots=False), rounds


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
