"""FedVTC: the losses, the alternation, the server's averages and generation (the closing phase and
whole runs: tests/test_fedvtc_runs.py)."""

import numpy as np
import pytest
import torch
from torch.distributions import Normal, kl_divergence

from edgefl.algorithms.fedvtc import (
    PSI,
    SIGMA,
    build_decoder,
    class_mean_sum,
    generate,
    kl_to_prototype,
    tc_terms,
    vtc_layout,
)
from edgefl.data import load_dataset
from edgefl.errors import ConfigError
from edgefl.models import ModelSpec
from edgefl.wire import Payload
from tests.fedvtc_cases import INFO, _changed, _device, _server, _snapshot, _spec


def test_kl_term_equals_the_closed_form_of_two_gaussians():
    torch.manual_seed(0)
    z, c = torch.randn(5, 980), torch.randn(5, 980)
    log_sigma = 0.3 * torch.randn(980)
    ours = kl_to_prototype(z, c, log_sigma)
    reference = kl_divergence(Normal(z, log_sigma.exp()), Normal(c, torch.ones(980))).sum(1)
    torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-3)
    # σ = 1 and z = c: no divergence at all
    assert float(kl_to_prototype(c, c, torch.zeros(980)).abs().max()) < 1e-4


def test_class_mean_sum_sums_the_per_class_means():
    values = torch.tensor([1.0, 3.0, 10.0, 4.0])
    y = torch.tensor([0, 0, 2, 7])
    assert float(class_mean_sum(values, y)) == pytest.approx(2.0 + 10.0 + 4.0)


def test_distribution_matching_runs_the_devices_own_extractor_on_generated_samples():
    device = _device()
    x, y = load_dataset("synthetic", "train").images(np.arange(6)), torch.arange(6)
    seen = []
    features = device.model.features
    device.model.features = lambda inp: seen.append(inp.detach().clone()) or features(inp)  # spy
    z = features(x).detach()
    eps = torch.randn(z.shape)
    protos = torch.randn(10, 980)
    terms = tc_terms(device.model, device.psi, x, y, z, device.log_sigma, protos, eps)
    generated = device.psi(z + device.log_sigma.exp() * eps)
    assert len(seen) == 1 and torch.allclose(seen[0], generated, atol=1e-6)
    expected = ((features(generated) - protos[y]) ** 2).sum(1).mean() * 6  # one sample per class
    assert float(terms.dm.detach()) == pytest.approx(float(expected.detach()), rel=1e-4)
    no_dm = tc_terms(
        device.model, device.psi, x, y, z, device.log_sigma, protos, eps, with_dm=False
    )
    assert float(no_dm.dm) == 0.0 and float(no_dm.le.detach()) == pytest.approx(
        float(terms.le.detach()), rel=1e-5
    )
    # the pull of z onto its class prototype: KL's z-part, ½‖z − c^y‖², one sample per class
    pull = (0.5 * ((z - protos[y]) ** 2).sum(1)).sum()
    assert float(terms.pull) == pytest.approx(float(pull), rel=1e-5)


def _seeded_device(options: dict):
    """A device of ``options`` built after torch.manual_seed(0), with fixed random prototypes."""
    torch.manual_seed(0)
    device = _device(options=options)
    device.protos = torch.randn(10, 980, generator=torch.Generator().manual_seed(1))
    return device


def test_align_weight_reweights_only_the_pull_of_z_onto_the_prototypes():
    # Prepare: one batch, the same device state and random streams for three option sets
    x, y = load_dataset("synthetic", "train").images(np.arange(8)), torch.arange(8) % 4

    def step_loss(**options):
        device = _seeded_device(options)
        opt = torch.optim.SGD(device.model.parameters(), lr=0.0)  # measure the loss, move nothing
        loss, _, z = device.step_model(x, y, opt, torch.Generator().manual_seed(2))
        return float(loss), float(class_mean_sum(0.5 * ((z - device.protos[y]) ** 2).sum(1), y))

    # Execute
    same, pull = step_loss(tc_weight="0.01")
    explicit, _ = step_loss(tc_weight="0.01", align_weight="0.01")
    strong, _ = step_loss(tc_weight="0.01", align_weight="1")
    # Assert: align_weight = tc_weight is the paper's single weight; a larger one adds only the pull
    assert explicit == pytest.approx(same, rel=1e-6)
    assert pull > 0 and strong - same == pytest.approx(0.99 * pull, rel=1e-4)


def test_proto_rc_weight_adds_the_decoding_of_the_prototypes_to_the_decoders_step():
    # Prepare: one batch, identical device state and noise for both option sets
    x, y = load_dataset("synthetic", "train").images(np.arange(8)), torch.arange(8) % 4

    def vtc_grad(**options):
        device = _seeded_device(options)
        z = device.model.features(x).detach()
        opt = torch.optim.SGD([*device.psi.parameters(), device.log_sigma], lr=0.0)
        device.step_vtc(x, y, z, opt, torch.Generator().manual_seed(2))
        return torch.cat([p.grad.flatten() for p in device.psi.parameters()]), device

    plain, _ = vtc_grad(proto_rc_weight="0")
    weighted, device = vtc_grad(proto_rc_weight="1")
    # the added term alone: ψ decoding v ~ N(c^y, σ²) (the prototypes, not z) towards the images
    psi = device.psi
    psi.zero_grad()
    psi.train()
    noise = torch.Generator().manual_seed(2)
    torch.randn((8, 980), generator=noise)  # the draw of L_tc's ε comes first
    v = device.protos[y] + device.log_sigma.exp().detach() * torch.randn((8, 980), generator=noise)
    class_mean_sum(((psi(v) - x) ** 2).flatten(1).sum(1), y).backward()
    term = torch.cat([p.grad.flatten() for p in psi.parameters()])
    assert term.norm() > 0
    torch.testing.assert_close(weighted - plain, term, rtol=1e-3, atol=1e-4)


def test_recalibrated_psi_has_the_batchnorm_statistics_of_the_latents_it_decodes():
    # Prepare: a server that knows three prototypes and σ, and an averaged ψ with wrong statistics
    server = _server(psi_bn="recalibrate")
    rng = np.random.default_rng(0)
    server.table.values[:] = rng.normal(0, 3, size=server.table.values.shape).astype(np.float32)
    server.table.known[:] = False
    server.table.known[[1, 4, 7]] = True
    server.sigma = np.full(980, 0.5, np.float32)
    arrays = {
        k: (
            np.full(s, 5.0)
            if "running" in k
            else rng.normal(0, 0.1, size=s)
            if dt.kind == "f"
            else np.zeros(s)
        ).astype(dt)
        for k, (s, dt) in server.psi_shapes.items()
    }
    # Execute
    out = server.recalibrated_psi(arrays)
    # Assert: the first BN's running mean is the mean of the first layer's output on such latents
    psi = build_decoder(server.layout, 0)
    psi.load_state_dict(
        {k.removeprefix(PSI): torch.from_numpy(np.array(v)) for k, v in arrays.items()}
    )
    v = torch.from_numpy(server.table.values[[1, 4, 7]]).repeat_interleave(2000, 0)
    v = v + 0.5 * torch.randn(v.shape, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        first = psi.layers[0](v.reshape(len(v), *server.layout.latent))
    name = next(k for k in out if k.endswith("layers.1.running_mean"))
    np.testing.assert_allclose(out[name], first.mean((0, 2, 3)).numpy(), atol=0.05)
    assert not np.allclose(out[name], 5.0)
    for k in arrays:  # the weights are untouched
        if "running" not in k and "num_batches" not in k:
            np.testing.assert_array_equal(out[k], arrays[k])


def test_alternation_leaves_the_frozen_part_unchanged():
    # ResNet: BatchNorm buffers on both sides, so "frozen" must include the running statistics.
    device = _device(_spec("resnet", "10", width=0.125))
    device.protos = torch.randn(10, 980)
    x, y = load_dataset("synthetic", "train").images(np.arange(16)), torch.arange(16) % 10
    noise = torch.Generator().manual_seed(0)
    opt_f = torch.optim.SGD(device.model.parameters(), lr=0.01)
    opt_v = device.vtc_optimizer(0)

    psi_before = _snapshot(device.psi, extra=[device.log_sigma])
    model_before = _snapshot(device.model)
    _, _, z = device.step_model(x, y, opt_f, noise)
    assert _changed(psi_before, _snapshot(device.psi, extra=[device.log_sigma])) == []
    assert _changed(model_before, _snapshot(device.model))  # the model did move

    model_before = _snapshot(device.model)
    psi_before = _snapshot(device.psi, extra=[device.log_sigma])
    device.step_vtc(x, y, z, opt_v, noise)
    assert _changed(model_before, _snapshot(device.model)) == []
    moved = _changed(psi_before, _snapshot(device.psi, extra=[device.log_sigma]))
    assert "extra0" in moved and any(k.endswith("weight") for k in moved)
    assert all(
        p.requires_grad
        for p in [*device.model.parameters(), *device.psi.parameters(), device.log_sigma]
    )


def test_server_averages_prototypes_per_class_with_missing_classes():
    server = _server()
    p = 980
    first = {
        "d00": {0: np.full(p, 1.0), 1: np.full(p, 2.0)},
        "d01": {1: np.full(p, 4.0), 3: np.full(p, 9.0)},
    }
    ups = {
        d: _uplink(protos, sigma=np.full(p, s))
        for (d, protos), s in zip(first.items(), (0.5, 1.5), strict=True)
    }
    server.aggregate(0, ups)
    np.testing.assert_allclose(server.table.values[0], 1.0)
    np.testing.assert_allclose(server.table.values[1], 3.0)  # unweighted mean over the two holders
    np.testing.assert_allclose(server.table.values[3], 9.0)
    assert server.table.known.tolist() == [True, True, False, True] + [False] * 6
    np.testing.assert_allclose(server.sigma, 1.0)
    # round 1: only class 1 reported; class 0 and 3 keep their values, nobody divides by zero
    server.aggregate(1, {"d02": _uplink({1: np.full(p, 10.0)}, sigma=np.full(p, 2.0))})
    np.testing.assert_allclose(server.table.values[[0, 1, 3], 0], [1.0, 10.0, 9.0])
    np.testing.assert_allclose(server.sigma, 2.0)
    # downlink: the device's own classes + σ; a device never heard from gets every known class
    down = server.downlink(1, "d01")
    assert down.arrays["proto_classes"].tolist() == [1, 3] and down.meta["phase"] == "train"
    assert down.arrays[SIGMA].shape == (p,)
    server.device_classes.pop("d00")
    assert server.downlink(1, "d00").arrays["proto_classes"].tolist() == [0, 1, 3]


def _uplink(protos, sigma):
    from edgefl.algorithms.fedproto import pack_prototypes

    return Payload(
        {**pack_prototypes(protos), SIGMA: sigma.astype(np.float32)}, {"num_samples": 10}
    )


def test_psi_averaging_is_parameter_wise_exact_and_skips_a_bad_upload():
    server = _server(psi_bn="average")  # the paper's average, BN statistics included
    rng = np.random.default_rng(0)
    reference = {k: v for k, v in server.psi_shapes.items()}
    ups = {}
    for d in ("d00", "d01", "d02"):
        ups[d] = Payload(
            {
                k: (rng.normal(size=s) if dt.kind == "f" else rng.integers(0, 9, size=s)).astype(dt)
                for k, (s, dt) in reference.items()
            }
        )
    bad = dict(ups["d00"].arrays)
    key = next(k for k in bad if k.endswith("weight"))
    bad[key] = bad[key][:1]
    ups["d03"] = Payload(bad)
    # closing: everyone
    assert server.select(2, sorted(ups), np.random.default_rng(0)) == sorted(ups)
    server.aggregate(2, ups)
    for k, (_, dt) in reference.items():
        stack = np.stack([ups[d].arrays[k].astype(np.float64) for d in ("d00", "d01", "d02")])
        expected = stack.mean(0)
        if dt.kind == "f":
            np.testing.assert_allclose(server.psi[k], expected.astype(dt), rtol=1e-6, atol=1e-7)
        else:
            assert server.psi[k] == np.rint(expected).astype(dt)
    final = server.downlink(3, "d00")
    assert final.meta["phase"] == "final" and all(k in final.arrays for k in reference)


def test_every_device_builds_the_same_decoder_from_the_servers_seed():
    a, b = _device(seed=1), _device(seed=2)
    assert not torch.equal(next(a.model.parameters()), next(b.model.parameters()))
    assert _changed(_snapshot(a.psi), _snapshot(b.psi)) == []
    server = _server()
    assert server.downlink(0, "d00").meta["vtc_seed"] == server.vtc_seed
    expected = build_decoder(server.layout, server.vtc_seed).state_dict()
    c = _device()
    c.psi = None
    c.receive(0, server.downlink(0, "d00"))
    assert all(torch.equal(expected[k], v) for k, v in c.psi.state_dict().items())


def test_generated_samples_have_the_input_shape_and_range():
    device = _device()
    protos = 50 * torch.randn(10, 980)  # far from anything trained: the Sigmoid still bounds them
    x, y = generate(device.psi, protos, torch.full((980,), 3.0), [0, 4, 9], per_class=7)
    assert x.shape == (21, *INFO.in_shape) and y.tolist() == [0] * 7 + [4] * 7 + [9] * 7
    assert float(x.min()) >= 0.0 and float(x.max()) <= 1.0
    assert device.psi.training  # generate() restores the mode it found


def test_layout_follows_the_paper_and_refuses_a_latent_that_does_not_reshape():
    assert vtc_layout(_spec()).latent == (20, 7, 7) and vtc_layout(_spec()).hidden == (16, 32, 32)
    rgb = ModelSpec("cnn", "2", 10, (3, 32, 32), feature_dim=4096)
    assert vtc_layout(rgb).latent == (64, 8, 8) and vtc_layout(rgb).hidden == (32, 64, 64)
    with pytest.raises(ConfigError, match="feature_dim"):
        vtc_layout(ModelSpec("cnn", "2", 10, INFO.in_shape, feature_dim=1000))

