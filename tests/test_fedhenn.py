"""CKA and FedHeNN: kernel alignment properties, the round's K̄ and RAD, η, the variants."""

import math

import numpy as np
import pytest
import torch

from edgefl.algorithms import (
    DeviceContext,
    DeviceRecord,
    ServerContext,
    TrainSettings,
    get_algorithm,
)
from edgefl.algorithms.cka import KernelTarget, cka, hsic, kernel
from edgefl.algorithms.fedhenn import KBAR, PROBE_IDX, PROBE_X, RAD_IDX, RAD_X, FedHeNNOptions, Z
from edgefl.data import load_dataset
from edgefl.errors import ConfigError
from edgefl.models import ModelSpec
from edgefl.runtime.simulation import simulate
from edgefl.wire import Payload, decode, encode
from edgefl.wire.envelope import Envelope
from tests.conftest import tiny_config

# -- CKA ------------------------------------------------------------------------------------


def numpy_hsic(k, l):  # noqa: E741
    n = k.shape[0]
    h = np.eye(n) - np.ones((n, n)) / n
    return float(np.sum((h @ k @ h) * (h @ l @ h)))


def t(a):
    return torch.from_numpy(np.asarray(a, np.float64))


def test_hsic_and_cka_match_a_numpy_reference():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(30, 6)), rng.normal(size=(30, 4))
    k, l = x @ x.T, y @ y.T  # noqa: E741
    assert float(hsic(t(k), t(l))) == pytest.approx(numpy_hsic(k, l), rel=1e-9)
    want = numpy_hsic(k, l) / math.sqrt(numpy_hsic(k, k) * numpy_hsic(l, l))
    assert float(cka(t(k), t(l))) == pytest.approx(want, rel=1e-9)
    assert 0 < want < 0.9  # unrelated representations are far from aligned


@pytest.mark.parametrize("kind", ["linear", "rbf"])
def test_cka_is_one_for_identical_rotated_and_scaled_representations(kind):
    rng = np.random.default_rng(1)
    z = rng.normal(size=(40, 8))
    q, _ = np.linalg.qr(rng.normal(size=(8, 8)))
    base = kernel(t(z), kind)
    for other in (z, z @ q, 3.5 * z):
        assert float(cka(base, kernel(t(other), kind))) == pytest.approx(1.0, abs=1e-9)
    noisy = z + rng.normal(size=z.shape)
    assert float(cka(base, kernel(t(noisy), kind))) < 0.95


def test_cka_compares_representations_of_different_widths():
    rng = np.random.default_rng(2)
    z = rng.normal(size=(50, 5))
    q, _ = np.linalg.qr(rng.normal(size=(12, 5)))  # 12×5 with orthonormal columns: z·qᵀ is 12-wide
    wide = z @ q.T
    assert wide.shape == (50, 12)
    assert float(cka(kernel(t(z)), kernel(t(wide)))) == pytest.approx(1.0, abs=1e-9)
    other = rng.normal(size=(50, 12))
    assert float(cka(kernel(t(z)), kernel(t(other)))) < 0.8
    target = KernelTarget(kernel(t(z)).float())
    assert float(target.cka(torch.from_numpy(wide).float())) == pytest.approx(1.0, abs=1e-4)


# -- FedHeNN --------------------------------------------------------------------------------

C = 10


def _pool(n=40):
    return load_dataset("synthetic", "train").subset(np.arange(n))


def _device(tier, opts, seed=0, n=48, public=None, steps=2):
    data = load_dataset("synthetic", "train").subset(
        np.arange(100 + 50 * seed, 100 + 50 * seed + n)
    )
    spec = ModelSpec("cnn", tier, C, (1, 28, 28), width=0.25)
    settings = TrainSettings(steps=steps, batch_size=16, lr=0.05)
    ctx = DeviceContext(f"d{seed}", spec, data, settings, seed=seed, rounds=5, public=public)
    return get_algorithm("fedhenn").device(ctx, opts)


def _server(opts, tiers=("1", "3"), pool=None):
    fleet = {
        f"d{i}": DeviceRecord(ModelSpec("cnn", tier, C, (1, 28, 28), width=0.25), 48)
        for i, tier in enumerate(tiers)
    }
    ctx = ServerContext(
        C, fleet, TrainSettings(), rounds=5, seed=0, public=pool if pool is not None else _pool()
    )
    return get_algorithm("fedhenn").server(ctx, opts)


def _wire(payload):
    """Through the real codec, as on a fleet."""
    return decode(encode(Envelope("train", 0, "d0", payload=payload))).payload


def test_eta_schedule():
    opts = FedHeNNOptions(eta0=0.02)
    assert [opts.eta_at(r) for r in (0, 1, 4, 9)] == pytest.approx([0.0, 0.02, 0.04, 0.06])
    device = _device("1", opts)
    assert device.eta(4) == 0.0  # no K̄ yet: no alignment term
    device.receive(4, Payload({RAD_X: _pool(8).x.numpy(), KBAR: np.eye(8, dtype=np.float16)}))
    assert device.eta(4) == pytest.approx(0.04)


def test_a_round_aligns_each_device_to_a_kbar_on_the_samples_it_forwards():
    opts = FedHeNNOptions(rad_size=16)
    server = _server(opts)
    pool = server.pool
    devices = {"d0": _device("1", opts, 0), "d1": _device("3", opts, 1)}
    # round 0: no K̄ yet; each device publishes Z on RAD_1
    first = server.downlink(0, "d0")
    assert KBAR not in first.arrays and PROBE_X in first.arrays
    ups = {}
    for d, dev in devices.items():
        dev.receive(0, _wire(server.downlink(0, d)))
        ups[d] = _wire(dev.fit(0))
    rad1 = server.rad(1)
    np.testing.assert_array_equal(first.arrays[PROBE_X], pool.x[torch.from_numpy(rad1)].numpy())
    assert (
        ups["d0"].arrays[Z].shape[0] == 16
        and ups["d0"].arrays[Z].shape[1] != ups["d1"].arrays[Z].shape[1]
    )
    server.aggregate(0, ups)
    # round 1: K̄ (N×N, float16) comes with exactly RAD_1, the samples the Z were computed on
    down = server.downlink(1, "d1")
    assert down.arrays[KBAR].shape == (16, 16) and down.arrays[KBAR].dtype == np.float16
    np.testing.assert_array_equal(down.arrays[RAD_X], first.arrays[PROBE_X])
    mean_k = sum(kernel(torch.from_numpy(u.arrays[Z]).double()) for u in ups.values()) / 2
    assert float(
        cka(torch.from_numpy(down.arrays[KBAR].astype(np.float64)), mean_k)
    ) == pytest.approx(1.0, abs=1e-3)
    dev = devices["d1"]
    dev.receive(1, _wire(down))
    assert dev.eta(1) == pytest.approx(0.01)
    up = dev.fit(1)
    assert 0.0 < up.meta["cka_before"] <= 1.0 and 0.0 < up.meta["cka_after"] <= 1.0
    # nobody reports: the next round has no kernel on its RAD, so no alignment term
    server.aggregate(1, {})
    assert KBAR not in server.downlink(2, "d0").arrays


def test_alignment_term_pulls_the_representation_towards_kbar():
    rng = np.random.default_rng(0)
    rad = _pool(24)
    target_z = rng.normal(size=(24, 6))
    kbar = (target_z @ target_z.T).astype(np.float32)
    results = {}
    for eta0 in (0.0, 5.0):
        device = _device("2", FedHeNNOptions(eta0=eta0), steps=15)
        device.receive(1, Payload({RAD_X: rad.x.numpy(), KBAR: kbar}))
        up = device.fit(1)
        results[eta0] = up.meta["cka_after"] - up.meta["cka_before"]
    assert results[5.0] > 0.05 and results[5.0] > results[0.0] + 0.05


def test_device_pool_mode_sends_indices_only():
    pool = _pool()
    opts = FedHeNNOptions(rad_size=12, rad_source="device")
    server = _server(opts, pool=pool)
    down = server.downlink(0, "d0")
    assert set(down.arrays) == {PROBE_IDX} and down.arrays[PROBE_IDX].dtype == np.int64
    device = _device("1", opts, public=pool)
    device.receive(0, _wire(down))
    torch.testing.assert_close(device.probe, pool.images(server.rad(1)))
    up = device.fit(0)
    server.aggregate(0, {"d0": up})
    assert set(server.downlink(1, "d0").arrays) == {RAD_IDX, KBAR, PROBE_IDX}
    with pytest.raises(ConfigError, match="pool on the device"):
        _device("1", opts).receive(0, down)


def test_server_needs_a_pool_and_state_round_trips():
    with pytest.raises(ConfigError, match="public_fraction"):
        fleet = {"d0": DeviceRecord(ModelSpec("cnn", "1", C, (1, 28, 28), width=0.25), 48)}
        get_algorithm("fedhenn").server(
            ServerContext(C, fleet, TrainSettings(), rounds=2, seed=0), FedHeNNOptions()
        )
    server = _server(FedHeNNOptions(rad_size=8))
    z = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    server.aggregate(0, {"d0": Payload({Z: z}, {"num_samples": 3})})
    other = _server(FedHeNNOptions(rad_size=8))
    other.load_state_dict(server.state_dict())
    np.testing.assert_array_equal(
        other.downlink(1, "d0").arrays[KBAR], server.downlink(1, "d0").arrays[KBAR]
    )


def test_heterogeneous_fleet_simulates_with_a_kernel_every_round(tmp_path):
    import json

    cfg = tiny_config(
        tmp_path, algorithm="fedhenn", rounds=3, tiers=("1", "3", "5"), options={"rad_size": "10"}
    )
    summary = simulate(cfg)
    assert summary["failed_per_round"] == [0, 0, 0]
    rounds = [
        json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()
    ]
    assert all(r["server"]["kbar_devices"] == 3 for r in rounds)
    assert "cka_mean" not in rounds[0]["server"] and 0 < rounds[2]["server"]["cka_mean"] <= 1
    assert 0 < rounds[2]["server"]["cka_before_mean"] <= 1
    assert set(summary["tier_accuracy"]) == {"1", "3", "5"}


def test_homogeneous_variant_keeps_personal_models(tmp_path):
    cfg = tiny_config(
        tmp_path, algorithm="fedhenn", tiers=("2",), options={"variant": "homo", "rad_size": "10"}
    )
    summary = simulate(cfg)
    assert summary["failed_per_round"] == [0, 0]
    assert len(summary["client_accuracy"]) == 3
    opts = FedHeNNOptions(variant="homo", rad_size=8)
    server = _server(opts, tiers=("2", "2"))
    device = _device("2", opts)
    before = {k: v.clone() for k, v in device.model.state_dict().items()}
    device.receive(1, _wire(server.downlink(1, "d0")))
    assert device.target is not None and device.eta(1) == pytest.approx(0.01)
    assert all(torch.equal(before[k], v) for k, v in device.model.state_dict().items())
