"""FedRep: the head never travels, the bodies are averaged, each device keeps its own head."""

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
from edgefl.algorithms.fedrep import FedRepOptions, is_head
from edgefl.data import load_dataset
from edgefl.errors import ConfigError
from edgefl.export.checkpoint import load_device_model
from edgefl.models import ModelSpec
from edgefl.runtime.setup import assemble
from edgefl.runtime.simulation import simulate
from edgefl.wire import Payload, decode, encode
from edgefl.wire.envelope import Envelope
from tests.conftest import tiny_config

C = 10
FEDREP = get_algorithm("fedrep")


def spec(tier="2"):
    return ModelSpec("cnn", tier, C, (1, 28, 28), width=0.25)


def device(seed, classes, opts=None, n=48):
    """A device whose data holds only ``classes`` of the synthetic set."""
    data = load_dataset("synthetic", "train")
    idx = np.flatnonzero(np.isin(data.y.numpy(), classes))[:n]
    settings = TrainSettings(steps=3, batch_size=16, lr=0.05)
    ctx = DeviceContext(f"d{seed}", spec(), data.subset(idx), settings, seed=seed, rounds=3)
    return FEDREP.device(ctx, opts or FedRepOptions())


def server(tiers=("2", "2")):
    fleet = {f"d{i}": DeviceRecord(spec(t), 48) for i, t in enumerate(tiers)}
    return FEDREP.server(
        ServerContext(C, fleet, TrainSettings(), rounds=3, seed=0), FedRepOptions()
    )


def wire(payload):
    """Through the real codec, as on a fleet."""
    return decode(encode(Envelope("train", 0, "d0", payload=payload))).payload


def params(model, head):
    return {n: p.detach().clone() for n, p in model.named_parameters() if is_head(n) == head}


def test_the_head_is_on_no_message_and_the_server_declares_the_body_exactly():
    srv, dev = server(), device(0, [0, 1])
    down = srv.downlink(0, "d0")
    body = {k for k in down.arrays}
    assert body and not any("classifier" in k for k in body)
    assert set(dev.expected_downlink()) == body == set(srv.expected_uplink("d0"))
    dev.receive(0, wire(down))
    up = dev.fit(0)
    assert set(up.arrays) == body  # the body, all of it, and nothing else
    # a downlink that carries a head is refused, whatever the agent's checks
    bad = Payload({**down.arrays, "w/classifier.bias": np.zeros(C, np.float32)})
    with pytest.raises(ValueError, match="exactly the body"):
        dev.receive(1, bad)


def test_the_head_trains_with_the_body_frozen_then_the_body_with_the_head_frozen():
    dev = device(0, [0, 1])
    body0, head0 = params(dev.model, False), params(dev.model, True)
    assert dev.train_head(0)["head_loss"] > 0
    assert all(torch.equal(body0[n], p) for n, p in params(dev.model, False).items())
    head1 = params(dev.model, True)
    assert any(not torch.equal(head0[n], p) for n, p in head1.items())
    # fit with no head epochs: only the body moves
    plain = device(0, [0, 1], FedRepOptions(head_epochs=0))
    head0 = params(plain.model, True)
    body0 = params(plain.model, False)
    plain.fit(0)
    assert all(torch.equal(head0[n], p) for n, p in params(plain.model, True).items())
    assert any(not torch.equal(body0[n], p) for n, p in params(plain.model, False).items())
    assert all(p.requires_grad for p in plain.model.parameters())  # unfrozen after the round


def test_the_bodies_are_averaged_by_data_size_and_installed_under_each_devices_own_head():
    srv = server()
    devs = [device(0, [0, 1], n=48), device(1, [2, 3], n=16)]
    ups = {}
    for i, d in enumerate(devs):
        d.receive(0, wire(srv.downlink(0, f"d{i}")))
        ups[f"d{i}"] = wire(d.fit(0))
    srv.aggregate(0, ups)
    for k, v in srv.weights.items():
        want = (48 * ups["d0"].arrays[k] + 16 * ups["d1"].arrays[k]) / 64
        np.testing.assert_allclose(v, want, rtol=0, atol=1e-6)
    heads = [params(d.model, True) for d in devs]
    for i, d in enumerate(devs):
        d.receive(1, wire(srv.downlink(1, f"d{i}")))
        for k, v in d.body_state().items():
            np.testing.assert_array_equal(v, srv.weights[k])
        assert all(torch.equal(heads[i][n], p) for n, p in params(d.model, True).items())
    w = "classifier.weight"
    assert not torch.equal(heads[0][w], heads[1][w])  # personal heads, trained apart


def test_a_run_ends_with_one_shared_body_and_heads_that_predict_each_devices_own_classes(
    tmp_path,
):
    cfg = tiny_config(
        tmp_path,
        algorithm="fedrep",
        clients=4,
        rounds=4,
        partition="shards",
        classes_per_client=2,
        fraction=1.0,
    )
    summary = simulate(cfg)
    run = assemble(cfg)
    models = {d: load_device_model(summary["run_dir"], d) for d in run.ids}
    state = {d: m.state_dict() for d, m in models.items()}
    first = run.ids[0]
    for d in run.ids[1:]:
        for k, v in state[first].items():
            assert torch.equal(v, state[d][k]) != is_head(k), (d, k)  # shared body, own head
    test = run.data.evals["test"]
    for i, d in enumerate(run.ids):
        held = np.flatnonzero(run.data.shard(i).class_counts())
        with torch.no_grad():
            models[d].eval()
            pred = torch.cat(
                [models[d](x).argmax(1) for x, _ in test.batches(500, shuffle=False)]
            ).numpy()
        assert np.isin(pred, held).mean() > 0.9, (d, held, np.bincount(pred, minlength=C))


def test_options_and_fleets_it_refuses():
    with pytest.raises(ConfigError, match="head_epochs"):
        FEDREP.parse_options({"head_epochs": "-1"})
    assert FEDREP.parse_options({"head_epochs": "3"}).head_epochs == 3
    with pytest.raises(ConfigError, match="architectures"):
        server(tiers=("1", "2"))
