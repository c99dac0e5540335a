"""The small HierarchyFL/HeteroFL cases that tests/test_hierarchyfl*.py share: model specs at
width 0.125, a fleet of them, a server and a device over synthetic data, and one torch thread
(import `_one_thread` into a test module to have it there)."""

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
from edgefl.algorithms.hierarchyfl import (
    HeteroFLServer,
    SubModelDevice,
)
from edgefl.data import load_dataset
from edgefl.models import ModelSpec

SETTINGS = TrainSettings(steps=2, batch_size=16, lr=0.05, momentum=0.9)


@pytest.fixture(autouse=True)
def _one_thread():
    # tiny models: a second intra-op thread only costs synchronisation on a busy machine
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def spec(family: str, tier: str, **kw) -> ModelSpec:
    return ModelSpec(
        family,
        tier,
        num_classes=10,
        in_shape=(1, 28, 28),
        width=0.125,
        mean=(0.5,),
        std=(0.25,),
        **kw,
    )


def fleet(family: str, tiers: list[str], **kw) -> dict[str, DeviceRecord]:
    return {
        f"d{i}": DeviceRecord(spec(family, t, **kw), num_samples=10 * (i + 1))
        for i, t in enumerate(tiers)
    }


def server(
    algorithm: str, devices: dict[str, DeviceRecord], public_n: int = 64, **options
) -> HeteroFLServer:
    data = load_dataset("synthetic", "train")
    ctx = ServerContext(
        10, devices, SETTINGS, rounds=2, seed=0, public=data.subset(np.arange(public_n))
    )
    algo = get_algorithm(algorithm)
    return algo.server(ctx, algo.parse_options(options))


def device(record_spec: ModelSpec, device_id: str = "d0", n: int = 48, **options) -> SubModelDevice:
    data = load_dataset("synthetic", "train").subset(np.arange(100, 100 + n))
    ctx = DeviceContext(device_id, record_spec, data, SETTINGS, seed=7, rounds=2)
    return SubModelDevice(ctx, get_algorithm("heterofl").parse_options(options))
