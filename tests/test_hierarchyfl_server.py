"""HierarchyFL's server: the ensemble library and distillation, the meta-learner, its server step
and schedule, hot-plug and checkpoints (the cases: tests/hierarchy_cases.py)."""

import numpy as np
import pytest
import torch

from edgefl.algorithms import (
    DeviceRecord,
    TrainSettings,
)
from edgefl.algorithms.hierarchyfl import (
    DELTAS,
    HierarchyFLOptions,
    HierarchyFLServer,
    kd_loss,
)
from edgefl.data import load_dataset
from edgefl.wire import Payload
from tests.hierarchy_cases import _one_thread, device, fleet, server, spec  # noqa: F401 (autouse)


def _mean_kl_small_to_ensemble(srv: HierarchyFLServer) -> float:
    x, y = next(srv.ctx.public.batches(len(srv.ctx.public), shuffle=False))
    with torch.no_grad():
        outputs = srv.hierarchy_outputs(x)
        m = torch.softmax(srv.theta, 0)
        ensemble = sum(w * p for w, (_, p) in zip(m, outputs, strict=True))
        return float(np.mean([kd_loss(p, ensemble, 3.0) for _, p in outputs[:-1]]))


def test_meta_weights_are_a_distribution_and_distillation_lowers_kl_to_the_ensemble():
    # Prepare: static BN so that measuring does not move running statistics
    srv = server(
        "hierarchyfl",
        fleet("hierarchy-depth", ["1", "2", "3", "4"], options={"bn": "static"}),
        public_n=96,
    )
    before = _mean_kl_small_to_ensemble(srv)
    # Execute: one pass over the public set (no uplinks: distillation alone)
    metrics = srv.aggregate(0, {})
    after = _mean_kl_small_to_ensemble(srv)
    # Assert
    w = srv.meta_weights()
    assert w.shape == (4,) and np.all(w > 0) and w.sum() == pytest.approx(1.0, abs=1e-6)
    assert not np.allclose(w, 0.25)  # the meta-learner moved
    assert metrics["distill_steps"] == 6  # ceil(96 / 16)
    assert after < before


def test_ensemble_switch_none_is_heterofl_and_logits_drops_the_feature_terms():
    devices = fleet("hierarchy-depth", ["1", "4"])
    hetero, none = server("heterofl", devices), server("hierarchyfl", devices, ensemble="none")
    dev = device(spec("hierarchy-depth", "4"), "d1")
    dev.receive(0, hetero.downlink(0, "d1"))
    up = dev.fit(0)
    hetero.aggregate(0, {"d1": up})
    none.aggregate(0, {"d1": up})
    for k, v in hetero.model.state_dict().items():
        torch.testing.assert_close(none.model.state_dict()[k], v, rtol=0, atol=0)
    # logits-only vs full: same KL terms, the difference is exactly beta * the MSE terms
    full, logits = (
        server("hierarchyfl", devices, beta=2.0),
        server("hierarchyfl", devices, ensemble="logits"),
    )
    x = full.ctx.public.images(np.arange(8))
    with torch.no_grad():
        outs = full.hierarchy_outputs(x)
        m = torch.tensor([0.1, 0.2, 0.3, 0.4])
        feats = [f for f, _ in outs]
        fm = sum(w * f for w, f in zip(m, feats, strict=True))
        mse = sum(
            torch.nn.functional.mse_loss(f, feats[-1]) for f in feats[:-1]
        ) + torch.nn.functional.mse_loss(feats[-1], fm)
        diff = full.distillation_loss(outs, m) - logits.distillation_loss(outs, m)
    assert float(diff) == pytest.approx(2.0 * float(mse), rel=1e-4)


def test_ensemble_labels_is_the_public_labels_cross_entropy_alone():
    devices = fleet("hierarchy-depth", ["1", "4"])
    labels = server("hierarchyfl", devices, ensemble="labels")
    x, y = next(labels.ctx.public.batches(8, shuffle=False))
    with torch.no_grad():
        outs = labels.hierarchy_outputs(x)
        m = torch.tensor([0.1, 0.2, 0.3, 0.4])
        expected = sum(torch.nn.functional.cross_entropy(p, y) for _, p in outs)
        assert float(labels.distillation_loss(outs, m, y)) == pytest.approx(
            float(expected), rel=1e-6
        )
    with pytest.raises(ValueError, match="server_ce"):
        HierarchyFLOptions(ensemble="labels", server_ce=False)


def test_bad_update_is_dropped_not_fatal():
    srv = server("heterofl", fleet("hierarchy-width", ["1/2", "1"]))
    before = {k: v.clone() for k, v in srv.model.state_dict().items()}
    good_shape = {DELTAS + k: np.zeros(tuple(v.shape), np.float32) for k, v in before.items()}
    wrong = Payload({k: np.ones((1,), np.float32) for k in good_shape}, {"num_samples": 5})
    nan = Payload(
        {k: np.full(v.shape, np.nan, np.float32) for k, v in good_shape.items()}, {"num_samples": 5}
    )
    metrics = srv.aggregate(0, {"d0": wrong, "d1": nan})
    assert metrics["rejected_updates"] == 2 and metrics["averaged_devices"] == 0
    # the round loop's wire check refuses the wrong shapes before they reach aggregate()
    from edgefl.errors import WireError
    from edgefl.wire.schema import check_arrays

    with pytest.raises(WireError):
        check_arrays(wrong.arrays, srv.expected_uplink("d0"))
    good = device(spec("hierarchy-width", "1/2"))
    good.receive(0, srv.downlink(0, "d0"))
    check_arrays(good.fit(0).arrays, srv.expected_uplink("d0"))  # a real device's uplink passes
    for k, v in srv.model.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)


def test_hot_plugged_device_starts_from_the_current_global_submodel():
    # Prepare: a server that has already moved away from its initial weights
    srv = server("hierarchyfl", fleet("hierarchy-depth", ["1", "2", "3", "4"]), public_n=32)
    initial = srv.downlink(0, "d1").arrays
    srv.aggregate(0, {})
    # Execute: a device the server has never seen joins with tier 2
    srv.ctx.fleet["late"] = DeviceRecord(spec("hierarchy-depth", "2"), num_samples=48)
    payload = srv.downlink(1, "late")
    # the statistics as sent
    late = device(spec("hierarchy-depth", "2"), "late", bn_stats="average")
    late.receive(1, payload)
    # Assert: it got the current global sub-model, not the initial one, and its update counts
    state = srv.model.state_dict()
    for k, v in late.model.state_dict().items():
        torch.testing.assert_close(v, state[k], rtol=0, atol=0)
    assert any(not np.array_equal(payload.arrays[k], initial[k]) for k in initial)
    metrics = srv.aggregate(1, {"late": late.fit(1)})
    assert metrics["averaged_devices"] == 1


def test_checkpoint_round_trip_keeps_model_and_meta_learner():
    devices = fleet("hierarchy-width", ["1/8", "1"])
    a = server("hierarchyfl", devices, public_n=32)
    a.aggregate(0, {})
    b = server("hierarchyfl", devices, public_n=32)
    b.load_state_dict(a.state_dict())
    np.testing.assert_array_equal(b.meta_weights(), a.meta_weights())
    for k, v in a.downlink(1, "d0").arrays.items():
        np.testing.assert_array_equal(b.downlink(1, "d0").arrays[k], v)


def _pretrain(srv: HierarchyFLServer, exits: list[int], steps: int = 150) -> None:
    """Train the server's global model on synthetic data with CE on ``exits`` (a fixed case)."""
    torch.manual_seed(0)
    data = load_dataset("synthetic", "train").subset(np.arange(300, 1300))
    opt = torch.optim.Adam(srv.model.parameters(), 1e-3)
    srv.model.train()
    rng, done = np.random.default_rng(0), 0
    while done < steps:
        for x, y in data.batches(32, shuffle=True, rng=rng):
            outs = srv.hierarchy_outputs(x)
            loss = sum(torch.nn.functional.cross_entropy(outs[i][1], y) for i in exits)
            opt.zero_grad()
            loss.backward()
            opt.step()
            done += 1
            if done == steps:
                break


def test_the_server_step_at_its_defaults_does_not_lower_the_exits_on_the_check_split(caplog):
    # measured on this case: −6.8, +3.9, +6.6 points at the defaults (server lr 0.05, T 1, chosen
    # by the benchmark's sweeps; at lr 0.005 and T 3 it was +1.0, +1.2, +4.3); the spec's earlier
    # step (lr 0.05, momentum 0.9, no CE) lost 11.1 points in its first round
    srv = server(
        "hierarchyfl", fleet("hierarchy-depth", ["1", "2", "3", "4"]), public_n=256, check_share=0.5
    )
    _pretrain(srv, [0, 1, 2, 3])
    changes = [srv.aggregate(r, {})["check_change"] for r in range(3)]
    assert len(srv.check_set) == 128 and len(srv.distill_set) == 128
    # not lower on average (the requirement), and a round that lowers it says so
    assert np.mean(changes) >= 0
    lowered = [r for r, c in enumerate(changes) if c < -1e-9]
    warned = [m for m in caplog.messages if "lowered the exits' mean accuracy" in m]
    assert len(warned) == len(lowered)


def test_the_meta_learner_moves_towards_the_exit_that_is_clearly_better():
    srv = server("hierarchyfl", fleet("hierarchy-depth", ["1", "2", "3", "4"]), public_n=256)
    _pretrain(srv, [3])  # only the last exit learns (measured: 28 % against 9–12 % for the others)
    acc = srv.exit_accuracies(srv.ctx.public)
    assert acc[3] > acc[:3].max() + 0.1
    for r in range(3):
        metrics = srv.aggregate(r, {})
    w = srv.meta_weights()
    assert metrics["meta_grad"] > 0.05
    assert int(np.argmax(w)) == 3 and w[3] > 0.35  # measured 0.41 after three rounds


def test_server_lr_follows_the_runs_decay_schedule():
    """The server step runs on the devices' schedule (the paper: "SGD on the same lr schedule"):
    server_lr before the first decay, ×lr_gamma at each decay round; None: the devices' lr."""
    from edgefl.algorithms.hierarchyfl import HierarchyFLOptions, server_lr_at

    settings = TrainSettings(lr=0.02, lr_decay_rounds=(8, 14), lr_gamma=0.1)
    opts = HierarchyFLOptions(server_lr=0.05)
    assert [server_lr_at(opts, settings, r) for r in (0, 7, 8, 13, 14, 19)] == pytest.approx(
        [0.05, 0.05, 0.005, 0.005, 0.0005, 0.0005])
    devices = HierarchyFLOptions(server_lr=None)
    assert [server_lr_at(devices, settings, r) for r in (0, 8, 14)] == pytest.approx(
        [0.02, 0.002, 0.0002]
    )
