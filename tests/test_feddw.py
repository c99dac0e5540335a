"""FedDW: the soft-label update, the DW regulariser and its gradient, the uplink, FedProx+DW."""

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
from edgefl.algorithms.feddw import (
    SL,
    SL_COUNTS,
    SL_SUMS,
    FedDWOptions,
    dw_regularizer,
    update_soft_labels,
)
from edgefl.algorithms.fedprox import proximal_term
from edgefl.data import load_dataset
from edgefl.errors import ConfigError
from edgefl.models import ModelSpec, build_model
from edgefl.wire import Payload

C = 10


def spec(head="feddw"):
    return ModelSpec("cnn", "1", C, (1, 28, 28), width=0.25, head=head)


def small_data(n=64, seed=0):
    data = load_dataset("synthetic", "train")
    return data.subset(np.random.default_rng(seed).choice(len(data), n, replace=False))


def reference_sl(prev, sums, counts, m, missing):
    out = np.array(prev, dtype=np.float64)
    for y in range(len(counts)):
        if counts[y] > 0:
            new = sums[y] / counts[y]
        else:
            new = np.eye(len(counts))[y] if missing == "onehot" else prev[y]
        out[y] = m * prev[y] + (1 - m) * new
    return out


@pytest.mark.parametrize("missing", ["onehot", "keep"])
def test_soft_label_update_matches_reference_with_missing_classes(missing):
    rng = np.random.default_rng(1)
    prev = rng.dirichlet(np.ones(4), size=4)
    counts = np.array([3.0, 0.0, 5.0, 0.0])
    sums = rng.dirichlet(np.ones(4), size=4) * counts[:, None]
    out = update_soft_labels(prev, sums, counts, momentum=0.5, missing_class=missing)
    np.testing.assert_allclose(out, reference_sl(prev, sums, counts, 0.5, missing))
    np.testing.assert_allclose(out.sum(1), 1.0)  # rows stay distributions
    if missing == "onehot":
        np.testing.assert_allclose(out[1], 0.5 * prev[1] + 0.5 * np.eye(4)[1])
    else:
        np.testing.assert_allclose(out[3], prev[3])


def test_regularizer_equals_the_formula_and_only_w_gets_its_gradient():
    model = build_model(spec())
    assert model.classifier.bias is None
    s = torch.softmax(torch.randn(C, C), 1)
    reg = dw_regularizer(model.classifier.weight, s)
    w = model.classifier.weight.detach().double()
    expected = ((s.double() - torch.softmax(w @ w.T, 1)) ** 2).sum() / C**2
    assert float(reg.detach()) == pytest.approx(float(expected), rel=1e-5)
    reg.backward()
    assert model.classifier.weight.grad is not None and model.classifier.weight.grad.abs().sum() > 0
    others = [
        n for n, p in model.named_parameters() if n != "classifier.weight" and p.grad is not None
    ]
    assert others == []


def test_device_loss_is_ce_plus_lambda_r_and_lambda_follows_the_schedule():
    opts = FedDWOptions(lam=0.5, lam_decay_rounds=(2, 4), lam_gamma=0.1)
    assert [opts.lam_at(r) for r in (0, 1, 2, 3, 4)] == pytest.approx([0.5, 0.5, 0.05, 0.05, 0.005])
    ctx = DeviceContext("d0", spec(), small_data(), TrainSettings(), seed=0, rounds=3)
    device = get_algorithm("feddw").device(ctx, opts)
    s = torch.softmax(torch.randn(C, C), 1)
    device.receive(0, Payload({SL: s.numpy()}))
    x, y = next(ctx.train_data.batches(16, shuffle=False))
    got = device.loss_fn(2)(x, y)
    want = F.cross_entropy(device.model(x), y) + 0.05 * dw_regularizer(
        device.model.classifier.weight, s
    )
    assert got.item() == pytest.approx(want.item(), rel=1e-6)


def test_fedprox_dw_adds_both_terms():
    opts = get_algorithm("fedprox-dw").parse_options({"mu": "2.0", "lam": "0.3"})
    ctx = DeviceContext("d0", spec(), small_data(), TrainSettings(), seed=0, rounds=3)
    device = get_algorithm("fedprox-dw").device(ctx, opts)
    s = torch.softmax(torch.randn(C, C), 1)
    device.receive(0, Payload({SL: s.numpy()}))
    anchor = [p.detach().clone() for p in device.model.parameters()]
    with torch.no_grad():
        device.model.fc1.weight.add_(0.01)  # move away from the anchor so the prox term is non-zero
    x, y = next(ctx.train_data.batches(16, shuffle=False))
    with torch.no_grad():
        got = float(device.loss_fn(0)(x, y))
        prox = 0.5 * 2.0 * float(proximal_term(device.model, anchor))
        want = (
            float(F.cross_entropy(device.model(x), y))
            + prox
            + 0.3 * float(dw_regularizer(device.model.classifier.weight, s))
        )
    assert prox > 0 and got == pytest.approx(want, rel=1e-5)


def test_uplink_carries_soft_label_sums_of_an_eval_pass():
    data = small_data(50)
    ctx = DeviceContext(
        "d0",
        spec(),
        data,
        TrainSettings(steps=2, batch_size=16, optimizer="adam", lr=1e-3),
        seed=0,
        rounds=1,
    )
    device = get_algorithm("feddw").device(ctx, FedDWOptions())
    up = device.fit(0)
    sums, counts = up.arrays[SL_SUMS], up.arrays[SL_COUNTS]
    np.testing.assert_array_equal(counts, data.class_counts())
    np.testing.assert_allclose(sums.sum(1), counts, rtol=1e-5)  # every softmax row sums to 1
    device.model.eval()
    with torch.no_grad():
        probs = torch.softmax(device.model(data.images()), 1).numpy()
    labels = data.y.numpy()
    np.testing.assert_allclose(
        sums[labels[0]], probs[labels == labels[0]].sum(0), rtol=1e-4, atol=1e-6
    )
    assert any(k.startswith("w/") for k in up.arrays)


def _server(options, n=2):
    fleet = {f"d{i}": DeviceRecord(spec(), 10) for i in range(n)}
    ctx = ServerContext(C, fleet, TrainSettings(), rounds=3, seed=0)
    return get_algorithm("feddw").server(ctx, options)


def _uplink(server, sums, counts, n):
    return Payload(
        {
            **dict(server.weights),
            SL_SUMS: sums.astype(np.float32),
            SL_COUNTS: counts.astype(np.float32),
        },
        {"num_samples": n},
    )


def test_server_builds_s_from_the_uplinks_and_sends_it():
    server = _server(FedDWOptions())
    np.testing.assert_array_equal(server.downlink(0, "d0").arrays[SL], np.eye(C))
    rng = np.random.default_rng(0)
    c0 = np.zeros(C)
    c0[:3] = [4, 2, 1]
    c1 = np.zeros(C)
    c1[2:5] = [3, 3, 3]
    s0 = rng.dirichlet(np.ones(C), size=C) * c0[:, None]
    s1 = rng.dirichlet(np.ones(C), size=C) * c1[:, None]
    metrics = server.aggregate(
        0, {"d0": _uplink(server, s0, c0, 7), "d1": _uplink(server, s1, c1, 9)}
    )
    want = reference_sl(np.eye(C), s0 + s1, c0 + c1, 0.5, "onehot")
    np.testing.assert_allclose(server.sl, want, rtol=1e-5)
    np.testing.assert_allclose(server.downlink(1, "d1").arrays[SL], want, rtol=1e-5)
    assert metrics["sl_classes_reported"] == 5
    # the mechanism's measure: the averaged classifier's class relations against the new S
    w = torch.from_numpy(np.asarray(server.weights["w/classifier.weight"], np.float64))
    cr = torch.softmax(w @ w.T, dim=1).numpy()
    assert metrics["cr_sl_distance"] == pytest.approx(
        float(dw_regularizer(w, torch.from_numpy(want))), rel=1e-6
    )
    assert metrics["cr_diag_mean"] == pytest.approx(np.diag(cr).mean(), rel=1e-6)
    assert metrics["cr_sl_diag_gap"] == pytest.approx(
        np.abs(np.diag(cr) - np.diag(want)).mean(), rel=1e-6
    )
    # a round without uplinks leaves S alone
    server.aggregate(1, {})
    np.testing.assert_allclose(server.sl, want, rtol=1e-5)


def test_cumulative_variant_averages_all_reports_so_far():
    server = _server(FedDWOptions(cumulative=True))
    c = np.ones(C)
    a = np.eye(C)
    b = np.full((C, C), 1.0 / C)
    server.aggregate(0, {"d0": _uplink(server, a, c, 5)})
    s1 = reference_sl(np.eye(C), a, c, 0.5, "onehot")
    server.aggregate(1, {"d0": _uplink(server, b, c, 5)})
    np.testing.assert_allclose(server.sl, reference_sl(s1, a + b, 2 * c, 0.5, "onehot"), rtol=1e-5)


def test_server_state_round_trips():
    server = _server(FedDWOptions(cumulative=True))
    server.aggregate(0, {"d0": _uplink(server, np.eye(C) * 2, np.full(C, 2.0), 5)})
    other = _server(FedDWOptions(cumulative=True))
    other.load_state_dict(server.state_dict())
    np.testing.assert_array_equal(other.sl, server.sl)
    np.testing.assert_array_equal(other.counts, server.counts)


def test_options_are_checked():
    with pytest.raises(ConfigError, match="sl_momentum"):
        get_algorithm("feddw").parse_options({"sl_momentum": "1.5"})
    with pytest.raises(ConfigError, match="choose one of"):
        get_algorithm("feddw").parse_options({"missing_class": "zero"})
    assert get_algorithm("feddw").parse_options({"lam_decay_rounds": "3,6"}).lam_decay_rounds == (
        3,
        6,
    )
    assert get_algorithm("feddw").defaults["head"] == "feddw"


def test_at_the_default_lambda_r_moves_the_classifier_as_much_as_a_tenth_of_ce_or_more():
    # Prepare: the benchmark's model (CNN tier 2, width 0.25, FedDW head) at init, one fixed batch
    # of 64 synthetic images, S = I (the server's first soft labels)
    torch.manual_seed(0)
    model = build_model(ModelSpec("cnn", "2", C, (1, 28, 28), width=0.25, head="feddw"))
    x, y = next(iter(small_data(64).batches(64, shuffle=False)))
    weight = model.classifier.weight
    lam = FedDWOptions().lam
    # Execute: the gradients of CE and of λ·R on the classifier W
    (g_ce,) = torch.autograd.grad(F.cross_entropy(model(x), y), weight)
    (g_r,) = torch.autograd.grad(lam * dw_regularizer(weight, torch.eye(C)), weight)
    ratio = float(g_r.norm() / g_ce.norm())
    # Assert: λ·R's gradient is at least 10 % of CE's (at the earlier λ = 0.1 it was ~1 % here and
    # ~5e-4 late in training: FedDW trained as FedAvg), and not so large that CE no longer matters
    assert 0.1 <= ratio <= 50, ratio
