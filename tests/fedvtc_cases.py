"""What tests/test_fedvtc*.py share: a CNN spec on synthetic data (feature dimension 980), a FedVTC
device on a few samples and a server."""

import numpy as np
import torch

from edgefl.algorithms import (
    DeviceContext,
    DeviceRecord,
    ServerContext,
    TrainSettings,
    get_algorithm,
)
from edgefl.algorithms.fedvtc import (
    FedVTCDevice,
    FedVTCServer,
)
from edgefl.data import dataset_info, load_dataset
from edgefl.models import ModelSpec
from edgefl.wire import Payload

INFO = dataset_info("synthetic")


def _spec(family="cnn", tier="2", **kw) -> ModelSpec:
    return ModelSpec(
        family, tier, 10, INFO.in_shape, width=kw.pop("width", 0.25), feature_dim=980, **kw
    )


def _device(spec=None, options=None, n=64, seed=1) -> FedVTCDevice:
    data = load_dataset("synthetic", "train").subset(np.arange(n))
    ctx = DeviceContext(
        "d00", spec or _spec(), data, TrainSettings(batch_size=16, steps=2), seed=seed, rounds=2
    )
    device = FedVTCDevice(ctx, get_algorithm("fedvtc").parse_options(options or {}))
    device.receive(0, Payload({}, {"vtc_seed": 7, "phase": "train"}))
    return device


def _server(n_devices=3, **options) -> FedVTCServer:
    fleet = {f"d{i:02d}": DeviceRecord(_spec(tier=str(1 + i % 5)), 10) for i in range(n_devices)}
    ctx = ServerContext(10, fleet, TrainSettings(), rounds=2, seed=0, fraction=0.5)
    return FedVTCServer(ctx, get_algorithm("fedvtc").parse_options(options))


def _snapshot(*modules, extra=()):
    out = {}
    for i, m in enumerate(modules):
        out.update({f"{i}.{k}": v.detach().clone() for k, v in m.state_dict().items()})
    out.update({f"extra{i}": t.detach().clone() for i, t in enumerate(extra)})
    return out


def _changed(before, after):
    return sorted(k for k in before if not torch.equal(before[k], after[k]))
