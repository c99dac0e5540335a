"""FedProto: prototypes on the device, the regulariser, and the server's per-class averages."""

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
from edgefl.algorithms.fedproto import (
    FedProtoDevice,
    FedProtoServer,
    local_prototypes,
    pack_prototypes,
    prototype_loss,
    unpack_prototypes,
)
from edgefl.data import dataset_info, load_dataset
from edgefl.errors import ConfigError
from edgefl.models import ModelSpec
from edgefl.wire import Payload

INFO = dataset_info("synthetic")


def _spec(tier="2", feature_dim=980):
    return ModelSpec("cnn", tier, 10, INFO.in_shape, width=0.25, feature_dim=feature_dim)


def _server(n=4, rounds=5, **options):
    fleet = {f"d{i:02d}": DeviceRecord(_spec(str(1 + i % 5)), 10) for i in range(n)}
    ctx = ServerContext(10, fleet, TrainSettings(), rounds=rounds, seed=0, fraction=0.25)
    return FedProtoServer(ctx, get_algorithm("fedproto").parse_options(options))


def test_local_prototypes_are_eval_mode_class_means_of_the_features():
    data = load_dataset("synthetic", "train").subset(np.arange(50))
    model = FedProtoDevice(
        DeviceContext("d00", _spec("5"), data, TrainSettings(), 1, 1),
        get_algorithm("fedproto").parse_options({}),
    ).model
    model.train()  # tier 5 has dropout: eval mode must be used inside, and the mode restored
    protos = local_prototypes(model, data, batch_size=7)
    assert model.training
    model.eval()
    with torch.no_grad():
        z = model.features(data.images())
    for c in sorted(set(data.y.tolist())):
        np.testing.assert_allclose(protos[c], z[data.y == c].mean(0).numpy(), rtol=1e-5, atol=1e-6)
    assert sorted(protos) == sorted(set(data.y.tolist()))


def test_prototype_loss_is_mse_over_samples_with_a_known_class():
    z = torch.randn(4, 3)
    y = torch.tensor([0, 1, 1, 2])
    protos = torch.randn(3, 3)
    known = torch.tensor([True, False, True])
    expected = F.mse_loss(z[[0, 3]], protos[[0, 2]])
    assert float(prototype_loss(z, y, protos, known)) == pytest.approx(float(expected))
    assert float(prototype_loss(z, y, protos, torch.zeros(3, dtype=torch.bool))) == 0.0


def test_prototypes_pack_and_unpack_and_reject_bad_classes():
    protos = {3: np.ones(4, np.float32), 1: np.zeros(4, np.float32)}
    arrays = pack_prototypes(protos)
    assert arrays["proto_classes"].tolist() == [1, 3]
    back = unpack_prototypes(arrays, num_classes=5, dim=4)
    assert sorted(back) == [1, 3] and np.array_equal(back[3], protos[3])
    with pytest.raises(ConfigError):
        unpack_prototypes({**arrays, "proto_classes": np.array([1, 7])}, num_classes=5, dim=4)
    with pytest.raises(ConfigError):
        unpack_prototypes({**arrays, "proto_classes": np.array([1, 1])}, num_classes=5, dim=4)
    with pytest.raises(ConfigError):
        unpack_prototypes(arrays, num_classes=5, dim=6)


def test_server_averages_holders_only_and_sends_each_device_its_classes():
    server = _server()
    ups = {
        "d00": Payload(pack_prototypes({0: np.full(980, 2.0), 4: np.full(980, 1.0)})),
        "d01": Payload(pack_prototypes({0: np.full(980, 6.0)})),
    }
    metrics = server.aggregate(0, ups)
    assert metrics["classes_updated"] == 2.0
    np.testing.assert_allclose(server.table.values[0], 4.0)
    np.testing.assert_allclose(server.table.values[4], 1.0)
    assert server.downlink(1, "d01").arrays["proto_classes"].tolist() == [0]
    # not heard from yet
    assert server.downlink(1, "d03").arrays["proto_classes"].tolist() == [0, 4]
    # checkpoints round-trip the table and the device classes
    other = _server()
    other.load_state_dict(server.state_dict())
    np.testing.assert_array_equal(other.table.values, server.table.values)
    assert other.device_classes == server.device_classes


def test_full_last_rounds_selects_every_device():
    server = _server(n=8, rounds=5, full_last_rounds=2)
    ids = sorted(server.ctx.fleet)
    assert len(server.select(2, ids, np.random.default_rng(0))) == 2
    assert server.select(3, ids, np.random.default_rng(0)) == ids


def test_device_regularises_towards_received_prototypes():
    data = load_dataset("synthetic", "train").subset(np.arange(40))
    options = get_algorithm("fedproto").parse_options({"lam": "1"})
    device = FedProtoDevice(
        DeviceContext("d00", _spec(), data, TrainSettings(batch_size=8, steps=2), 1, 1), options
    )
    x, y = data.images(np.arange(8)), data.y[:8]
    plain = float(device.loss(x, y).detach())
    device.receive(0, Payload(pack_prototypes({int(c): np.full(980, 5.0) for c in y.unique()})))
    # features near 0 are far from prototypes of 5
    assert float(device.loss(x, y).detach()) > plain + 1.0
    up = device.fit(0)
    assert up.arrays["proto"].shape == (len(set(data.y.tolist())), 980)


def test_fedproto_needs_a_common_feature_dimension():
    fleet = {"d00": DeviceRecord(_spec(feature_dim=None), 10)}
    with pytest.raises(ConfigError, match="feature_dim"):
        FedProtoServer(
            ServerContext(10, fleet, TrainSettings(), rounds=1, seed=0),
            get_algorithm("fedproto").parse_options({}),
        )
