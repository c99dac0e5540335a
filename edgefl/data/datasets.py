"""Datasets held in memory as uint8 tensors for training; files are read by
:mod:`edgefl.data.sources`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from edgefl.data.sources import (  # noqa: F401  (re-exported: the registry and file locations)
    FASHION_MNIST_SYSTEM_DIR,
    SPLITS,
    DatasetInfo,
    dataset_info,
    dataset_names,
    load_arrays,
    locate_idx,
    pixel_stats,
    search_dirs,
)
from edgefl.errors import ConfigError


class ArrayDataset:
    """Images as uint8 [N, C, H, W] (a quarter of float32's memory) and int64 labels [N]."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, info: DatasetInfo):
        if x.dtype != torch.uint8 or tuple(x.shape[1:]) != info.in_shape:
            raise ConfigError(
                f"x must be uint8 [N, {', '.join(map(str, info.in_shape))}], got {x.dtype} "
                f"{list(x.shape)}"
            )
        if y.dtype != torch.int64 or tuple(y.shape) != (x.shape[0],):
            raise ConfigError(f"y must be int64 [{x.shape[0]}], got {y.dtype} {list(y.shape)}")
        if len(y) and (int(y.min()) < 0 or int(y.max()) >= info.num_classes):
            raise ConfigError(
                f"labels must lie in [0, {info.num_classes}), got {int(y.min())}..{int(y.max())}"
            )
        self.x, self.y, self.info = x, y, info

    @classmethod
    def from_numpy(cls, x: np.ndarray, y: np.ndarray, info: DatasetInfo) -> ArrayDataset:
        """Wrap numpy arrays; ``x`` is shared, not copied, when it is already contiguous."""
        labels = np.asarray(y).astype(np.int64)
        return cls(torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(labels), info)

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def __repr__(self) -> str:
        return f"ArrayDataset({self.info.name!r}, {len(self)} samples of {self.info.in_shape})"

    def subset(self, indices: np.ndarray) -> ArrayDataset:
        """A new dataset of the given rows; tensor indexing copies, so it shares no storage."""
        rows = _rows(indices)
        return ArrayDataset(self.x[rows], self.y[rows], self.info)

    def images(self, indices: np.ndarray | None = None) -> torch.Tensor:
        """Float32 images in [0, 1], all of them or the given rows."""
        return _to_float(self.x if indices is None else self.x[_rows(indices)])

    def class_counts(self) -> np.ndarray:
        return np.bincount(self.y.numpy(), minlength=self.info.num_classes)

    def batches(
        self,
        batch_size: int,
        *,
        shuffle: bool,
        rng: np.random.Generator | None = None,
        drop_last: bool = False,
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """One epoch of (float32 images in [0, 1], int64 labels).

        Shuffling draws only from ``rng``, never from global state, so an epoch's order
        is reproducible from the seed that made the generator.
        """
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        if shuffle and rng is None:
            raise ConfigError(
                "shuffle=True needs rng=np.random.default_rng(seed) for a reproducible order"
            )
        order = torch.from_numpy(rng.permutation(len(self))) if shuffle else None
        # A separate generator so that the checks above run at the call, not at the first batch.
        return self._epoch(batch_size, order, drop_last)

    def _epoch(self, batch_size: int, order: torch.Tensor | None, drop_last: bool):
        n = len(self)
        end = n - n % batch_size if drop_last else n
        for start in range(0, end, batch_size):
            if order is None:
                rows = slice(start, start + batch_size)
            else:
                rows = order[start : start + batch_size]
            yield _to_float(self.x[rows]), self.y[rows]


def _rows(indices: np.ndarray) -> torch.Tensor:
    rows = np.asarray(indices)
    if rows.ndim != 1 or (rows.size and rows.dtype.kind not in "iu"):
        raise ConfigError(
            f"indices must be a 1-D integer array, got {rows.dtype} of shape {rows.shape}"
        )
    return torch.from_numpy(rows.astype(np.int64, copy=False))


def _to_float(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32).div_(255.0)




def load_dataset(name: str, split: str, data_dir: str | Path | None = None) -> ArrayDataset:
    """Load one split ("train" or "test") of a registered dataset into memory."""
    return ArrayDataset.from_numpy(*load_arrays(name, split, data_dir))
