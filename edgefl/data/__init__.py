"""Datasets (in-memory uint8 tensors, loaded by name) and client partitioners.

Everything but ``ArrayDataset`` and ``load_dataset`` works without torch; those two are imported
on first use, so that a device with the base install reads its files through the same code.
"""

from __future__ import annotations

import importlib
from typing import Any

from edgefl.data.acquire import ensure_fashion_mnist
from edgefl.data.partition import (
    carve_public,
    dirichlet_partition,
    iid_partition,
    label_distribution,
    partition,
    shard_partition,
)
from edgefl.data.sources import DatasetInfo, dataset_info, dataset_names, load_arrays, pixel_stats

_TORCH_NAMES = {"ArrayDataset": "datasets", "load_dataset": "datasets"}

__all__ = [
    "ArrayDataset",
    "DatasetInfo",
    "carve_public",
    "dataset_info",
    "dataset_names",
    "dirichlet_partition",
    "ensure_fashion_mnist",
    "iid_partition",
    "label_distribution",
    "load_arrays",
    "load_dataset",
    "partition",
    "pixel_stats",
    "shard_partition",
]


# Lazy on purpose: these two import torch; everything else here is read on torch-free devices (the
# base install), through this package.
def __getattr__(name: str) -> Any:
    if name not in _TORCH_NAMES:
        raise AttributeError(f"module 'edgefl.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"edgefl.data.{_TORCH_NAMES[name]}"), name)
    globals()[name] = value
    return value
