"""What tests/test_felo*.py share: model specs, server contexts and devices of Felo, Velo and FedHe
over synthetic data, knowledge uplinks with their numpy reference, and one torch thread per
module (import `_one_thread` into a test module to have it there)."""

import numpy as np
import pytest
import torch

from edgefl.algorithms import (
    DeviceContext,
    DeviceRecord,
    ServerContext,
    TrainSettings,
)
from edgefl.algorithms.felo import (
    FedHeDevice,
    FedHeOptions,
    FeloDevice,
    FeloOptions,
    VeloDevice,
    VeloOptions,
)
from edgefl.data import dataset_info, load_dataset
from edgefl.models import ModelSpec
from edgefl.wire import Payload

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
