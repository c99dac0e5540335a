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
        #: where :meth:`batches` and :meth:`images` put their tensors (None: where ``x`` is, the
        #: CPU). The images stay in CPU memory; :meth:`on` names a training device.
        self.compute: torch.device | None = None

    def on(self, device: str | torch.device) -> ArrayDataset:
        """This dataset (the same storage), with batches and images made on ``device``."""
        out = ArrayDataset(self.x, self.y, self.info)
        out.compute = None if torch.device(device).type == "cpu" else torch.device(device)
        return out

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
        out = ArrayDataset(self.x[rows], self.y[rows], self.info)
        out.compute = self.compute
        return out

    def images(self, indices: np.ndarray | None = None) -> torch.Tensor:
        """Float32 images in [0, 1], all of them or the given rows."""
        return self._float(self.x if indices is None else self.x[_rows(indices)])

    def labels(self, indices: np.ndarray) -> torch.Tensor:
        """The labels of the given rows, where :meth:`images` puts the images."""
        y = self.y[_rows(indices)]
        return y if self.compute is None else y.to(self.compute)

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
            if self.compute is None:
                yield _to_float(self.x[rows]), self.y[rows]
            else:
                yield self._float(self.x[rows]), self.y[rows].to(self.compute, non_blocking=True)

    def _float(self, x: torch.Tensor) -> torch.Tensor:
        """uint8 rows as float32 in [0, 1] on the training device (moved as uint8: ¼ the bytes)."""
        return _to_float(x if self.compute is None else x.to(self.compute, non_blocking=True))


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
