"""Felo, Velo and FedHe: server averaging, the device loss, same-architecture FedAvg (the CVAE, runs
and defaults: tests/test_felo_velo.py)."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from edgefl.algorithms import (
    DeviceContext,
    DeviceRecord,
    ServerContext,
    TrainSettings,
    get_algorithm,
)
from edgefl.algorithms.felo import (
    FeloDevice,
    FeloOptions,
    FeloServer,
    LossTerms,
    VeloOptions,
    VeloServer,
    felo_loss,
)
from edgefl.errors import ConfigError, WireError
from edgefl.wire import Payload
from tests.felo_cases import (  # noqa: F401 (_one_thread: autouse)
    DEVICES,
    C,
    _data,
    _device,
    _knowledge,
    _one_thread,
    reference_means,
    server_ctx,
    spec,
    uplink,
)


# -- server averaging ------------------------------------------------------------------------------
def test_server_class_averages_match_numpy_with_missing_classes_and_devices():
    # Prepare: three devices; d02 misses round 0 entirely, classes 5-9 are never reported.
    server = FeloServer(server_ctx(["10", "14", "10"]), FeloOptions(average_weights=False))
    rng = np.random.default_rng(0)
    round0 = {
        "d00": uplink([3, 1, 2, 0, 0, 0, 0, 0, 0, 0], rng),
        "d01": uplink([0, 4, 0, 7, 0, 0, 0, 0, 0, 0], rng),
    }
    round1 = {"d02": uplink([5, 0, 0, 0, 1, 0, 0, 0, 0, 0], rng)}
    # Execute
    server.aggregate(0, round0)
    after0 = server.downlink(1, "d01").arrays
    server.aggregate(1, round1)
    after1 = server.downlink(2, "d00").arrays
    # Assert
    ref0, known0 = reference_means(list(round0.values()), "logit")
    np.testing.assert_allclose(after0["logit"], ref0, rtol=1e-5, atol=1e-6)
    assert after0["known"].tolist() == known0.astype(np.uint8).tolist()
    everything = [*round0.values(), *round1.values()]
    for key in ("logit", "feat"):
        ref, known = reference_means(everything, key)
        np.testing.assert_allclose(after1[key], ref, rtol=1e-5, atol=1e-6)
    assert after1["known"].tolist() == [1, 1, 1, 1, 1, 0, 0, 0, 0, 0]
    assert not np.any(after1["feat"][5:])  # never reported: zeros, and no distillation term
    assert "w/stem.conv.weight" not in after1  # weights off


def test_server_history_is_bounded_per_class():
    server = FeloServer(server_ctx(["10"]), FeloOptions(history=2, average_weights=False))
    rng = np.random.default_rng(1)
    ups = [uplink([1, 0, 0, 0, 0, 0, 0, 0, 0, 2], rng) for _ in range(3)]
    for r, p in enumerate(ups):
        server.aggregate(r, {"d00": p})
    ref, _ = reference_means(ups[1:], "logit")  # the first entry has been pushed out
    np.testing.assert_allclose(server.downlink(3, "d00").arrays["logit"], ref, rtol=1e-5, atol=1e-6)


def test_server_ignores_malformed_knowledge():
    server = FeloServer(server_ctx(["10", "10"]), FeloOptions(average_weights=False))
    rng = np.random.default_rng(2)
    good = uplink([2] * C, rng)
    bad = uplink([2] * C, rng, d=7)  # wrong feature dim
    server.aggregate(0, {"d00": good, "d01": bad})
    np.testing.assert_allclose(
        server.downlink(1, "d00").arrays["feat"], good.arrays["feat"], rtol=1e-6
    )


def test_fleet_with_different_feature_dims_needs_a_common_one():
    with pytest.raises(ConfigError, match="feature-dim"):
        FeloServer(server_ctx(["10", "50"]), FeloOptions())
    fleet = {"a": DeviceRecord(spec("10", 32)), "b": DeviceRecord(spec("50", 32))}
    server = FeloServer(ServerContext(C, fleet, TrainSettings(), rounds=2, seed=0), FeloOptions())
    assert server.feature_dim == 32


# -- same-architecture averaging -------------------------------------------------------------------
def test_weights_are_averaged_only_within_an_architecture():
    # Prepare: d00, d02 are ResNet10; d01, d03 ResNet14; d03 does not report.
    server = FeloServer(server_ctx(["10", "14", "10", "14"]), FeloOptions())
    init14 = {
        k: v.copy() for k, v in server.downlink(0, "d03").arrays.items() if k.startswith("w/")
    }
    rng = np.random.default_rng(3)

    def weights_of(device, value):
        base = server.downlink(0, device).arrays
        return {
            k: np.full_like(v, value)
            for k, v in base.items()
            if k.startswith("w/") and v.dtype.kind == "f"
        } | {k: v for k, v in base.items() if k.startswith("w/") and v.dtype.kind != "f"}

    ups = {
        "d00": uplink([1] * C, rng, weights=weights_of("d00", 1.0), n=10),
        "d02": uplink([1] * C, rng, weights=weights_of("d02", 5.0), n=30),
    }
    # Execute: only ResNet10 devices report
    server.aggregate(0, ups)
    # Assert: ResNet10 = |D|-weighted mean; ResNet14 untouched; each device gets its own
    # architecture
    w10 = server.downlink(1, "d00").arrays
    assert w10["w/stem.conv.weight"].flat[0] == pytest.approx((10 * 1 + 30 * 5) / 40)
    assert w10.keys() == server.downlink(1, "d02").arrays.keys()
    w14 = server.downlink(1, "d01").arrays
    for k, v in init14.items():
        np.testing.assert_array_equal(w14[k], v)
    device14 = FeloDevice(
        DeviceContext("d01", spec("14"), _data(20), TrainSettings(), 0, 10), FeloOptions()
    )
    assert {k[2:] for k in w14 if k.startswith("w/")} == set(device14.model.state_dict())
    assert {k for k in w10 if k.startswith("w/")} != {k for k in w14 if k.startswith("w/")}
    # Execute: now a ResNet14 device reports; ResNet10 keeps its average
    server.aggregate(1, {"d01": uplink([1] * C, rng, weights=weights_of("d01", 7.0), n=20)})
    assert server.downlink(2, "d03").arrays["w/stem.conv.weight"].flat[0] == pytest.approx(7.0)
    assert server.downlink(2, "d00").arrays["w/stem.conv.weight"].flat[0] == pytest.approx(4.0)


def test_device_loss_is_ce_plus_alpha_times_mse_and_kl_over_known_classes():
    # Prepare: the server knows classes 0-4 only
    alpha = 0.3
    device = _device(FeloOptions(alpha=alpha))
    know = _knowledge([1] * 5 + [0] * 5)
    device.receive(1, know)
    data = _data(32, seed=100)
    x, y = data.x, data.y
    assert 0 < int((y < 5).sum()) < len(y)
    device.model.eval()  # deterministic features for the reference
    # Execute
    with torch.no_grad():
        terms = device.loss_terms(x, y, round=5)
    # Assert: an independent computation of the three terms
    with torch.no_grad():
        s = device.model.features(x)
        p = device.model.classify(s)
        feat = torch.as_tensor(know.arrays["feat"])
        logit = torch.as_tensor(know.arrays["logit"])
        mask = (y < 5).float()
        mse = (((s - feat[y]) ** 2).mean(1) * mask).sum() / len(y)
        q = torch.softmax(logit[y], 1)
        kl = ((q * (torch.log(q) - torch.log_softmax(p, 1))).sum(1) * mask).sum() / len(y)
        ce = F.cross_entropy(p, y)
    assert float(terms.ce) == pytest.approx(float(ce), rel=1e-5)
    assert float(terms.mse) == pytest.approx(float(mse), rel=1e-5) and float(mse) > 0
    assert float(terms.kl) == pytest.approx(float(kl), rel=1e-5) and float(kl) > 0
    assert float(terms.total) == pytest.approx(float(ce + alpha * (mse + kl)), rel=1e-5)


@torch.no_grad()
def test_warmup_and_unknown_classes_disable_distillation():
    device = _device(FeloOptions(alpha=0.5, warmup_fraction=0.1), rounds=20)  # 2 warm-up rounds
    device.receive(0, _knowledge([1] * C))
    device.model.eval()
    x, y = _data(16, seed=200).x, _data(16, seed=200).y
    for r in (0, 1):
        t = device.loss_terms(x, y, round=r)
        assert float(t.total) == float(t.ce) and float(t.mse) == 0 and float(t.kl) == 0
    assert float(device.loss_terms(x, y, round=2).total) > float(
        device.loss_terms(x, y, round=2).ce
    )
    device.receive(2, _knowledge([0] * C))  # nothing known: no distillation term at all
    t = device.loss_terms(x, y, round=5)
    assert float(t.total) == float(t.ce)


def test_fedhe_distils_logits_only_and_uploads_no_features_or_weights():
    options = get_algorithm("fedhe").parse_options({})
    device = _device(options)
    device.receive(1, _knowledge([1] * C))
    device.model.eval()
    x, y = _data(16, seed=300).x, _data(16, seed=300).y
    with torch.no_grad():
        t = device.loss_terms(x, y, round=5)
    assert float(t.mse) == 0 and float(t.kl) > 0
    assert float(t.total) == pytest.approx(float(t.ce + 0.5 * t.kl), rel=1e-6)
    up = device.fit(5)
    assert set(up.arrays) == {"logit", "count"} and up.meta["distill"] is True


def test_device_uplink_holds_class_means_of_what_it_trained_on():
    device = _device(VeloOptions(points_per_class=3))
    up = device.fit(0)
    seen = up.arrays["count"]
    assert seen.sum() == 2 * 16  # two steps of 16
    labels = up.arrays["point_label"]
    for c in range(C):
        # one point per step
        assert 1 <= (labels == c).sum() <= 2 if seen[c] else (labels == c).sum() == 0
        if seen[c] == 0:
            assert not np.any(up.arrays["feat"][c]) and not np.any(up.arrays["logit"][c])
    assert up.arrays["point"].shape == (len(labels), 64)
    # no weights came down (no other device shares its architecture), so none go up
    assert not any(k.startswith("w/") for k in up.arrays) and up.meta["distill"] is False
    server = VeloServer(server_ctx(["10", "10"]), VeloOptions(points_per_class=3))
    device.receive(1, server.downlink(1, "d00"))
    assert any(k.startswith("w/") for k in device.fit(1).arrays)


def test_a_device_whose_architecture_no_other_device_has_exchanges_no_weights():
    # Prepare: ResNet10 twice, ResNet14 once
    server = FeloServer(server_ctx(["10", "14", "10"]), FeloOptions())
    # Execute / Assert: the lone ResNet14 gets knowledge only, and none of its weights are expected
    lone, shared = server.downlink(0, "d01").arrays, server.downlink(0, "d00").arrays
    assert not any(k.startswith("w/") for k in lone) and {"logit", "known", "feat"} <= set(lone)
    assert any(k.startswith("w/") for k in shared)
    assert not any(k.startswith("w/") for k in server.expected_uplink("d01"))
    assert any(k.startswith("w/") for k in server.expected_uplink("d00"))
    assert sum(a.nbytes for a in lone.values()) < sum(a.nbytes for a in shared.values()) / 10


@torch.no_grad()
def test_felo_loss_without_server_statistics_is_cross_entropy():
    model = _device(FeloOptions()).model
    x, y = _data(8).x, _data(8).y
    t = felo_loss(model, x, y, alpha=0.5)
    assert float(t.total) == float(t.ce) == pytest.approx(float(F.cross_entropy(t.logits, y)))


def test_server_feature_ce_trains_the_classifier_on_classes_the_batch_lacks():
    model = _device(FeloOptions()).model
    x, y = _data(8).x, _data(8).y
    head = [p for p in model.parameters() if p.ndim == 2][-1]  # the classifier's weight (C×d)
    c, d = head.shape
    absent = next(k for k in range(c) if k not in set(y.tolist()))
    known = torch.ones(c, dtype=torch.bool)
    server_logit, server_feat = torch.zeros(c, c), torch.randn(c, d)
    kwargs = dict(alpha=0.5, known=known, server_logit=server_logit, server_feat=server_feat)

    def head_grad(weight: float) -> tuple[float, LossTerms]:
        model.zero_grad()
        t = felo_loss(model, x, y, server_feature_ce=weight, **kwargs)
        t.total.backward()
        return head.grad[absent].abs().sum().item(), LossTerms(
            *(v.detach() for v in vars(t).values())
        )

    plain, t0 = head_grad(0.0)
    calibrated, t1 = head_grad(1.0)
    # Assert: off, the loss is the paper's; on, the term adds the classifier's CE on the server's
    # features
    assert float(t0.total) == pytest.approx(float(t0.ce + 0.5 * (t0.mse + t0.kl)))
    with torch.no_grad():
        extra = F.cross_entropy(model.classify(server_feat), torch.arange(c))
    assert float(t1.total) == pytest.approx(float(t0.total + extra), rel=1e-5)
    # the absent class's row of the classifier now gets a gradient from its feature
    assert calibrated > plain
    with pytest.raises(ValueError, match="server_feature_ce"):
        FeloOptions(server_feature_ce=-1.0)


def test_expected_uplink_matches_what_devices_send():
    from edgefl.wire import array_spec
    from edgefl.wire.schema import check_arrays

    for options, server_cls in ((VeloOptions(), VeloServer), (FeloOptions(), FeloServer)):
        server = server_cls(server_ctx(["10", "14", "10", "14"]), options)
        device = DEVICES[type(options)](
            DeviceContext(
                "d01", spec("14"), _data(32), TrainSettings(steps=1, batch_size=16), 0, 10
            ),
            options,
        )
        device.receive(0, server.downlink(0, "d01"))
        up = device.fit(0)
        check_arrays(up.arrays, server.expected_uplink("d01"))  # a well-formed uplink passes
        with pytest.raises(WireError, match="undeclared array|shape"):
            # ResNet14 weights where ResNet10's are due
            check_arrays(up.arrays, server.expected_uplink("d00"))
    he = get_algorithm("fedhe").server(server_ctx(["10"]), get_algorithm("fedhe").parse_options({}))
    assert he.expected_uplink("d00") == {
        "logit": array_spec(np.float32, (C, C)),
        "count": array_spec(np.int64, (C,)),
    }


def test_bn_stats_recalibrate_re_estimates_the_received_statistics_on_the_devices_data():
    # Prepare: averaged weights whose running statistics describe other weights (random ones)
    torch.manual_seed(5)
    sender = _device(FeloOptions())
    state = {k: v.clone() for k, v in sender.model.state_dict().items()}
    state = {k: (torch.rand_like(v) + 0.5 if "running" in k else v) for k, v in state.items()}
    weights = Payload({f"w/{k}": v.numpy() for k, v in state.items() if v.is_floating_point()}, {})
    weights.arrays.update(_knowledge([1] * C).arrays)
    keeping, recalibrating = _device(FeloOptions()), _device(FeloOptions(bn_stats="recalibrate"))
    # Execute
    keeping.receive(1, weights)
    recalibrating.receive(1, weights)
    # Assert: "average" (the paper's) keeps what came; "recalibrate" evaluates with its data's own
    # statistics for those weights, and the weights themselves are the received ones
    x = recalibrating.ctx.train_data.images()
    with torch.no_grad():
        # the batch's own statistics (64 samples: one batch)
        own = copy.deepcopy(recalibrating.model).train()(x)
        recalibrated, kept = recalibrating.model.eval()(x), keeping.model.eval()(x)
    # unbiased vs biased variance
    torch.testing.assert_close(recalibrated, own, rtol=0.02, atol=0.02)
    assert (kept - own).abs().max() > 10 * (recalibrated - own).abs().max()
    for k, v in keeping.model.state_dict().items():
        if v.is_floating_point():
            torch.testing.assert_close(v, state[k])
            if "running" not in k:
                torch.testing.assert_close(recalibrating.model.state_dict()[k], state[k])
