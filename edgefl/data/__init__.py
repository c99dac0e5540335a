"""Datasets (in-memory uint8 tensors, loaded by name) and client partitioners."""

from edgefl.data.acquire import ensure_fashion_mnist
from edgefl.data.datasets import (
    ArrayDataset,
    DatasetInfo,
    dataset_info,
    dataset_names,
    load_dataset,
    pixel_stats,
)
from edgefl.data.partition import (
    carve_public,
    dirichlet_partition,
    iid_partition,
    label_distribution,
    partition,
    shard_partition,
)

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
    "load_dataset",
    "partition",
    "pixel_stats",
    "shard_partition",
]
