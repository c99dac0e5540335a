"""Felo, Velo and FedHe: server averaging, the device loss, the CVAE, same-architecture FedAvg."""

import copy
import json

import numpy as np
import pytest
import safetensors.numpy
import torch
import torch.nn.functional as F

from edgefl.algorithms import (
    DeviceContext,
    DeviceRecord,
    ServerContext,
    TrainSettings,
    get_algorithm,
)
from edgefl.algorithms.cvae import CVAE, conditional_fit, generate, train_cvae
from edgefl.algorithms.felo import (
    FedHeDevice,
    FedHeOptions,
    FeloDevice,
    FeloOptions,
    FeloServer,
    LossTerms,
    VeloDevice,
    VeloOptions,
    VeloServer,
    felo_loss,
)
from edgefl.config import resolve_config
from edgefl.data import dataset_info, load_dataset
from edgefl.errors import ConfigError, WireError
from edgefl.models import ModelSpec
from edgefl.runtime.simulation import simulate
from edgefl.wire import Payload
from tests.conftest import tiny_config

C = 10


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # A loaded 2-core machine: two intra-op threads spin against each other.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def spec(tier="10", feature_dim=None):
    info = dataset_info("synthetic")
    return ModelSpec(
        "resnet",
        tier,
        C,
        info.in_shape,
        width=0.125,
        feature_dim=feature_dim,
        options={"stem": "imagenet"},
    )


def server_ctx(tiers, rounds=10):
    fleet = {
        f"d{i:02d}": DeviceRecord(spec(t), num_samples=10 * (i + 1)) for i, t in enumerate(tiers)
    }
    return ServerContext(C, fleet, TrainSettings(), rounds=rounds, seed=0)


def uplink(counts, rng, d=64, weights=None, n=10):
    """Knowledge for the classes with count > 0 (other rows are garbage: they must be ignored)."""
    counts = np.asarray(counts, np.int64)
    arrays = {
        "logit": rng.normal(size=(C, C)).astype(np.float32),
        "feat": rng.normal(size=(C, d)).astype(np.float32),
        "count": counts,
    }
    arrays.update(weights or {})
    return Payload(arrays, {"num_samples": n})


def reference_means(payloads, key):
    num = np.zeros_like(payloads[0].arrays[key], dtype=np.float64)
    den = np.zeros(C)
    for p in payloads:
        cnt = p.arrays["count"].astype(np.float64)
        num += cnt[:, None] * p.arrays[key]
        den += cnt
    return np.where(den[:, None] > 0, num / np.maximum(den, 1)[:, None], 0.0), den > 0


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


# -- the device loss -------------------------------------------------------------------------------
def _data(n, seed=0):
    return load_dataset("synthetic", "train").subset(np.arange(seed, seed + n))


#: The device half of each method's options type (one each).
DEVICES = {FedHeOptions: FedHeDevice, FeloOptions: FeloDevice, VeloOptions: VeloDevice}


def _device(options, rounds=20):
    ctx = DeviceContext(
        "d00", spec("10"), _data(64), TrainSettings(steps=2, batch_size=16), seed=0, rounds=rounds
    )
    return DEVICES[type(options)](ctx, options)


def _knowledge(known, d=64, seed=0):
    rng = np.random.default_rng(seed)
    return Payload(
        {
            "logit": rng.normal(size=(C, C)).astype(np.float32),
            "feat": rng.normal(size=(C, d)).astype(np.float32),
            "known": np.asarray(known, np.uint8),
        }
    )


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


# -- the CVAE --------------------------------------------------------------------------------------
def test_cvae_learns_class_conditional_gaussians():
    # Prepare: 4 classes in 8 dims, means 3 apart, std 0.3
    rng = np.random.default_rng(0)
    means = rng.normal(size=(4, 8)) * 3
    labels = np.repeat(np.arange(4), 150)
    feats = means[labels] + 0.3 * rng.normal(size=(len(labels), 8))
    torch.manual_seed(0)
    cvae = CVAE(4, 8, embed_dim=32)
    # Execute
    losses = train_cvae(cvae, feats, labels, epochs=25, batch_size=50, lr=1e-3, seed=0)
    samples = generate(cvae, np.repeat(np.arange(4), 25), seed=1)
    # Assert: training lowers the loss; every sample is nearest to its own class mean
    assert losses[-1] < 0.5 * losses[0]
    dist = ((samples[:, None, :] - means[None]) ** 2).sum(-1)
    assert (dist.argmin(1) == np.repeat(np.arange(4), 25)).all()
    assert (
        generate(cvae, np.arange(4), seed=5).tolist()
        == generate(cvae, np.arange(4), seed=5).tolist()
    )
    # the fit Velo reports: samples land in their class; an untrained CVAE's do not
    fit, real, spread = conditional_fit(cvae, feats, labels, seed=0)
    assert fit == 1.0 and real == 1.0 and 0 < spread < 10
    untrained_fit, _, _ = conditional_fit(CVAE(4, 8, embed_dim=32), feats, labels, seed=0)
    assert untrained_fit < 0.75


def test_cvae_training_is_the_same_at_any_caller_thread_count_and_restores_it():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(3), 40)
    feats = rng.normal(size=(len(labels), 8)).astype(np.float32) + labels[:, None]
    threads = torch.get_num_threads()
    weights = []
    try:
        for caller in (2, 1):
            torch.set_num_threads(caller)
            torch.manual_seed(0)
            cvae = CVAE(3, 8, embed_dim=16)
            train_cvae(cvae, feats, labels, epochs=2, batch_size=20, lr=1e-3, seed=0)
            assert torch.get_num_threads() == caller  # the caller's count, back after training
            weights.append({k: v.clone() for k, v in cvae.state_dict().items()})
    finally:
        torch.set_num_threads(threads)
    # trained at one thread both times
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_velo_server_trains_the_cvae_and_checkpoints_it_as_arrays(tmp_path):
    # Prepare: points around per-class centres
    options = VeloOptions(cvae_epochs=3, warmup_fraction=0.0)
    server = VeloServer(server_ctx(["10", "14"]), options)
    rng = np.random.default_rng(4)
    centres = rng.normal(size=(C, 64)).astype(np.float32)
    ups = {}
    for d in ("d00", "d01"):
        p = uplink([4] * 5 + [0] * 5, rng)
        labels = np.repeat(np.arange(5), 6)
        p.arrays["point"] = (centres[labels] + 0.1 * rng.normal(size=(30, 64))).astype(np.float32)
        p.arrays["point_label"] = labels.astype(np.int64)
        ups[d] = p
    # Execute
    metrics = server.aggregate(0, ups)
    down = server.downlink(1, "d00").arrays
    # Assert: trained on all 60 points; synthetic features replace the averages; only classes with
    # data known
    assert metrics["cvae_points"] == 60 and np.isfinite(metrics["cvae_loss"])
    assert down["known"].tolist() == [1] * 5 + [0] * 5
    ref, _ = reference_means(list(ups.values()), "feat")
    assert not np.allclose(down["feat"][:5], ref[:5])
    # a checkpoint is plain safetensors; a fresh server restored from it sends the same downlink
    safetensors.numpy.save_file(
        {k: np.ascontiguousarray(v) for k, v in server.state_dict().items()}, tmp_path / "s"
    )
    restored = VeloServer(server_ctx(["10", "14"]), options)
    restored.load_state_dict(safetensors.numpy.load_file(tmp_path / "s"))
    again = restored.downlink(1, "d00").arrays
    assert again.keys() == down.keys()
    for k in down:
        np.testing.assert_array_equal(again[k], down[k])
    assert server.aggregate(1, {})["known_classes"] == 5  # a round where nobody reported is fine


def test_velo_trains_every_interval_after_warmup():
    # 2 warm-up rounds
    server = VeloServer(server_ctx(["10"], rounds=40), VeloOptions(cvae_interval=3))
    # until a first training
    assert [r for r in range(10) if server.train_due(r)] == list(range(1, 10))
    server.trained = True
    assert [r for r in range(10) if server.train_due(r)] == [1, 4, 7]


# -- whole runs ------------------------------------------------------------------------------------
def test_felo_devices_of_one_architecture_share_a_model_fedhe_devices_do_not(tmp_path):
    common = {
        "clients": 4,
        "tiers": ("10", "14"),
        "fraction": 1.0,
        "rounds": 2,
        "partition": "dirichlet",
        "alpha": 1.0,
    }
    felo = simulate(tiny_config(tmp_path / "felo", algorithm="felo", **common))
    fedhe = simulate(tiny_config(tmp_path / "fedhe", algorithm="fedhe", **common))
    acc, acc_he = felo["client_accuracy"], fedhe["client_accuracy"]
    # tiers round-robin: 10, 14, 10, 14
    assert acc["d00"] == acc["d02"] and acc["d01"] == acc["d03"]
    rounds = [
        json.loads(line) for line in (tmp_path / "felo/run/rounds.jsonl").read_text().splitlines()
    ]
    assert rounds[0]["server"]["architectures_averaged"] == 2
    # FedHe sends about a kilobyte of knowledge per device; Felo adds the weights
    he_rounds = [
        json.loads(line) for line in (tmp_path / "fedhe/run/rounds.jsonl").read_text().splitlines()
    ]
    per_device = lambda rs: [b for r in rs for b in r["bytes_up"].values()]  # noqa: E731
    assert max(per_device(he_rounds)) < 2000 < min(per_device(rounds))
    assert len(set(acc_he.values())) > 1 or acc_he["d00"] != acc["d00"]


def test_velo_run_records_cvae_training(tmp_path):
    simulate(
        tiny_config(
            tmp_path,
            algorithm="velo",
            rounds=3,
            clients=2,
            fraction=1.0,
            options={"cvae_epochs": "2"},
        )
    )
    rounds = [json.loads(line) for line in (tmp_path / "run/rounds.jsonl").read_text().splitlines()]
    # warm-up is 1 round: training starts at round 0
    assert all("cvae_loss" in r["server"] for r in rounds)
    assert rounds[-1]["server"]["cvae_points"] > rounds[0]["server"]["cvae_points"]


def test_defaults_are_the_papers_and_model_options_follow_the_model():
    felo = get_algorithm("felo")
    cfg = resolve_config({}, felo.defaults)
    # the code's model, optimizer and batch; our local budget (two epochs, every device every round)
    assert (
        cfg.model,
        cfg.tiers,
        cfg.optimizer,
        cfg.lr,
        cfg.batch_size,
        cfg.steps,
        cfg.epochs,
        cfg.fraction,
    ) == (
        "resnet",
        ("10", "14", "18", "22", "26"),
        "adam",
        1e-3,
        50,
        None,
        2,
        1.0,
    )
    assert cfg.model_options == {"stem": "imagenet"}
    assert resolve_config({"model": "cnn"}, felo.defaults).model_options == {}
    assert felo.parse_options({"alpha": "0.25"}).alpha == 0.25
    with pytest.raises(ConfigError, match="feature_upload"):
        get_algorithm("velo").parse_options({"feature_upload": "everything"})


def test_batchnorm_counters_keep_their_shape_over_the_wire():
    # Felo uploads whole state dicts; BatchNorm's num_batches_tracked is a 0-d tensor
    from edgefl.wire import Envelope, decode, encode

    arrays = {
        "w/bn.num_batches_tracked": np.array(7, np.int64),
        "w/x": np.ones((3, 4), np.float32)[:, ::2],
    }
    env = decode(
        encode(
            Envelope(
                kind="update", round=0, device_id="d00", payload=Payload(arrays, {"num_samples": 1})
            )
        )
    )
    assert env.payload.arrays["w/bn.num_batches_tracked"].shape == ()
    assert env.payload.arrays["w/x"].shape == (3, 2)


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
