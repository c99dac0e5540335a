"""Datasets held in memory as uint8 tensors, and the registry that loads them by name."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from edgefl.data import cifar, idx, synthetic
from edgefl.data.folder import list_classes, read_image_folder
from edgefl.errors import ConfigError, DataNotFoundError, UnknownNameError

log = logging.getLogger(__name__)

SPLITS = ("train", "test")


@dataclass(frozen=True)
class DatasetInfo:
    """What a model needs to know about a dataset; mean and std are for pixels scaled to [0, 1]."""

    name: str
    num_classes: int
    in_shape: tuple[int, int, int]  # C, H, W
    mean: tuple[float, ...]
    std: tuple[float, ...]
    class_names: tuple[str, ...]


class ArrayDataset:
    """Images as uint8 [N, C, H, W] (a quarter of float32's memory) and int64 labels [N]."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, info: DatasetInfo):
        if x.dtype != torch.uint8 or tuple(x.shape[1:]) != info.in_shape:
            raise ConfigError(
                f"x must be uint8 [N, {', '.join(map(str, info.in_shape))}], got {x.dtype} {list(x.shape)}"
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


def pixel_stats(x: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of uint8 images [N, C, H, W], scaled to [0, 1].

    Works from a 256-bin histogram, so it never holds a float copy of the dataset.
    """
    values = np.arange(256) / 255.0
    means, stds = [], []
    for channel in range(x.shape[1]):
        counts = np.bincount(x[:, channel].ravel(), minlength=256)
        p = counts / counts.sum()
        mean = float(p @ values)
        means.append(mean)
        stds.append(math.sqrt(float(p @ (values - mean) ** 2)))
    return tuple(means), tuple(stds)


# ---------------------------------------------------------------- where the files live

# Where Debian's dataset-fashion-mnist package installs the four .gz files.
FASHION_MNIST_SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")


def search_dirs(name: str, data_dir: str | Path | None) -> list[Path]:
    """``data_dir`` alone when given; else the system dir (Fashion-MNIST), $EDGEFL_DATA/<name>, ./data/<name>."""
    if data_dir is not None:
        return [Path(data_dir).expanduser()]
    dirs = [FASHION_MNIST_SYSTEM_DIR] if name == "fashion-mnist" else []
    if os.environ.get("EDGEFL_DATA"):
        dirs.append(Path(os.environ["EDGEFL_DATA"]).expanduser() / name)
    dirs.append(Path.cwd() / "data" / name)
    return dirs


def _not_found(what: str, dirs: list[Path], expected: str, how: str) -> DataNotFoundError:
    hint = "" if os.environ.get("EDGEFL_DATA") else " (set EDGEFL_DATA=DIR to add DIR/<dataset>)"
    looked = ", ".join(str(d) for d in dirs)
    return DataNotFoundError(
        f"{what} not found. Looked in: {looked}{hint}. Expected {expected}. {how}"
    )


# ---------------------------------------------------------------- the datasets

FASHION_MNIST = DatasetInfo(
    "fashion-mnist", 10, (1, 28, 28), (0.2860,), (0.3530,), idx.FASHION_MNIST_CLASSES
)
MNIST = DatasetInfo("mnist", 10, (1, 28, 28), (0.1307,), (0.3081,), idx.MNIST_CLASSES)
CIFAR10 = DatasetInfo(
    "cifar10",
    10,
    (3, 32, 32),
    (0.4914, 0.4822, 0.4465),
    (0.2470, 0.2435, 0.2616),
    cifar.CIFAR10_CLASSES,
)
CIFAR100 = DatasetInfo(
    "cifar100",
    100,
    (3, 32, 32),
    (0.5071, 0.4865, 0.4409),
    (0.2673, 0.2564, 0.2762),
    cifar.CIFAR100_CLASSES,
)
CINIC10 = DatasetInfo(  # statistics published with the dataset (BayesWatch/cinic-10)
    "cinic10",
    10,
    (3, 32, 32),
    (0.4789, 0.4723, 0.4305),
    (0.2421, 0.2383, 0.2587),
    cifar.CIFAR10_CLASSES,
)

_IDX_RAW_SUBDIR = {"fashion-mnist": "FashionMNIST", "mnist": "MNIST"}  # torchvision's layout
_CIFAR_FILES = {"cifar10": cifar.CIFAR10_FILES, "cifar100": cifar.CIFAR100_FILES}


def locate_idx(name: str, data_dir: str | Path | None, splits: tuple[str, ...] = SPLITS) -> Path:
    """The first search dir holding the IDX files of all ``splits``, else DataNotFoundError."""
    dirs = search_dirs(name, data_dir)
    for d in dirs:
        if all(idx.find_idx_files(d, s, _IDX_RAW_SUBDIR[name]) for s in splits):
            return d
    files = ", ".join(f for s in SPLITS for f in idx.idx_file_names(s))
    if name == "fashion-mnist":
        how = (
            "Install it with `sudo apt-get install dataset-fashion-mnist`, or run "
            "`python -m edgefl.data.fetch fashion-mnist`, or put the files in one of those directories."
        )
    else:
        how = f"Put the files in {dirs[0]}."
    raise _not_found(f"{name} ({'+'.join(splits)})", dirs, f"{files} (each may be .gz)", how)


def _load_idx(info: DatasetInfo, split: str, data_dir: Path | None) -> ArrayDataset:
    directory = locate_idx(info.name, data_dir, (split,))
    images_path, labels_path = idx.find_idx_files(directory, split, _IDX_RAW_SUBDIR[info.name])
    images, labels = idx.read_idx(images_path), idx.read_idx(labels_path)
    if images.dtype != np.uint8 or images.shape[1:] != info.in_shape[1:]:
        raise DataNotFoundError(
            f"{images_path} holds {images.dtype} {images.shape}, expected uint8 N x 28 x 28"
        )
    if labels.shape != images.shape[:1]:
        raise DataNotFoundError(
            f"{labels_path} holds {labels.shape} labels for {len(images)} images"
        )
    log.info("read %s and %s", images_path, labels_path)
    return ArrayDataset.from_numpy(images[:, None], labels, info)


def _load_cifar(info: DatasetInfo, split: str, data_dir: Path | None) -> ArrayDataset:
    layout = _CIFAR_FILES[info.name]
    dirs = search_dirs(info.name, data_dir)
    for d in dirs:
        found = cifar.find_and_read(layout, d, split)
        if found is not None:
            return ArrayDataset.from_numpy(*found, info)
    how = f"Download it from https://www.cs.toronto.edu/~kriz/cifar.html and extract it into {dirs[0]}."
    raise _not_found(f"{info.name} ({split})", dirs, layout.expected_files(), how)


def _load_cinic(info: DatasetInfo, split: str, data_dir: Path | None) -> ArrayDataset:
    dirs = search_dirs(info.name, data_dir)
    for root in (r for d in dirs for r in (d, d / "cinic-10")):
        if (root / split).is_dir():
            x, y = read_image_folder(
                root / split, info.class_names, channels=3, size=info.in_shape[1:]
            )
            return ArrayDataset.from_numpy(x, y, info)
    how = f"Download CINIC-10 from https://datashare.ed.ac.uk/handle/10283/3192 and extract it into {dirs[0]}."
    raise _not_found(
        f"{info.name} ({split})", dirs, f"{split}/<class>/*.png, optionally under cinic-10/", how
    )


def _load_synthetic(info: DatasetInfo, split: str, _data_dir: Path | None) -> ArrayDataset:
    channels, side, _ = info.in_shape
    return ArrayDataset.from_numpy(*synthetic.make_synthetic(split, channels, side), info)


# Filled as train splits are read, so a test split reuses the train split's class list
# and pixel statistics instead of decoding the train images a second time.
_FOLDER_INFO: dict[Path, DatasetInfo] = {}


def _folder_root(path: str, data_dir: Path | None) -> Path:
    if not path and data_dir is None:
        raise ConfigError("imagefolder needs a root: 'imagefolder:/path/to/root' or data_dir")
    root = Path(path or data_dir).expanduser().resolve()
    if not (root / "train").is_dir():
        raise DataNotFoundError(
            f"{root / 'train'} not found; imagefolder expects root/{{train,test}}/<class>/*.png"
        )
    return root


def _read_folder_train(root: Path) -> tuple[np.ndarray, np.ndarray, DatasetInfo]:
    classes = list_classes(root / "train")
    x, y = read_image_folder(root / "train", classes)
    mean, std = pixel_stats(x)
    info = DatasetInfo(f"imagefolder:{root}", len(classes), x.shape[1:], mean, std, classes)
    _FOLDER_INFO[root] = info
    return x, y, info


def _folder_info(root: Path) -> DatasetInfo:
    return _FOLDER_INFO.get(root) or _read_folder_train(root)[2]


def _load_folder(path: str, split: str, data_dir: Path | None) -> ArrayDataset:
    root = _folder_root(path, data_dir)
    if split == "train":
        x, y, info = _read_folder_train(root)
    else:
        info = _folder_info(root)
        if not (root / split).is_dir():
            raise DataNotFoundError(
                f"{root / split} not found; imagefolder expects root/{split}/<class>/*.png"
            )
        x, y = read_image_folder(
            root / split, info.class_names, channels=info.in_shape[0], size=info.in_shape[1:]
        )
    return ArrayDataset.from_numpy(x, y, info)


def _synthetic_info(name: str, channels: int, side: int) -> DatasetInfo:
    return DatasetInfo(
        name,
        synthetic.NUM_CLASSES,
        (channels, side, side),
        (synthetic.PIXEL_MEAN,) * channels,
        (synthetic.PIXEL_STD,) * channels,
        tuple(f"pattern-{i}" for i in range(synthetic.NUM_CLASSES)),
    )


SYNTHETIC = _synthetic_info("synthetic", 1, 28)
SYNTHETIC_RGB = _synthetic_info("synthetic-rgb", 3, 32)


# ---------------------------------------------------------------- the registry


@dataclass(frozen=True)
class _Source:
    info: Callable[[str], DatasetInfo]  # gets the text after "name:" ("" when there is none)
    load: Callable[[str, str, Path | None], ArrayDataset]  # (text after the colon, split, data_dir)
    takes_path: bool = False


def _fixed(
    info: DatasetInfo, load: Callable[[DatasetInfo, str, Path | None], ArrayDataset]
) -> _Source:
    return _Source(
        info=lambda _path: info, load=lambda _path, split, data_dir: load(info, split, data_dir)
    )


_SOURCES: dict[str, _Source] = {
    "fashion-mnist": _fixed(FASHION_MNIST, _load_idx),
    "mnist": _fixed(MNIST, _load_idx),
    "cifar10": _fixed(CIFAR10, _load_cifar),
    "cifar100": _fixed(CIFAR100, _load_cifar),
    "cinic10": _fixed(CINIC10, _load_cinic),
    "imagefolder": _Source(
        info=lambda path: _folder_info(_folder_root(path, None)), load=_load_folder, takes_path=True
    ),
    "synthetic": _fixed(SYNTHETIC, _load_synthetic),
    "synthetic-rgb": _fixed(SYNTHETIC_RGB, _load_synthetic),
}


def dataset_names() -> list[str]:
    """Registered names; ``imagefolder`` is used as ``imagefolder:/path/to/root``."""
    return sorted(_SOURCES)


def _lookup(name: str) -> tuple[_Source, str]:
    key, colon, path = name.partition(":")
    source = _SOURCES.get(key.strip().lower())
    if source is None or (colon and not source.takes_path):
        raise UnknownNameError("dataset", name, dataset_names())
    return source, path


def dataset_info(name: str) -> DatasetInfo:
    """A dataset's info without loading it (an imagefolder's train split is read once for its statistics)."""
    source, path = _lookup(name)
    return source.info(path)


def load_dataset(name: str, split: str, data_dir: str | Path | None = None) -> ArrayDataset:
    """Load one split ("train" or "test") of a registered dataset into memory."""
    source, path = _lookup(name)
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
    dataset = source.load(path, split, None if data_dir is None else Path(data_dir).expanduser())
    log.info("loaded %s %s: %d samples", dataset.info.name, split, len(dataset))
    return dataset
