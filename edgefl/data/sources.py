"""Where dataset files live and how they are read into numpy arrays; the registry of names.

No torch here: a device that only runs exported models (``edgefl infer`` on the base install)
reads its test data with :func:`load_arrays`. :func:`edgefl.data.load_dataset` wraps the same
arrays as an :class:`~edgefl.data.datasets.ArrayDataset` of tensors for training.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgefl.data import cifar, idx, synthetic
from edgefl.data.folder import list_classes, read_image_folder
from edgefl.errors import ConfigError, DataNotFoundError, UnknownNameError

log = logging.getLogger(__name__)

SPLITS = ("train", "test")

#: (uint8 images [N, C, H, W], int64 labels [N], the dataset's info)
Arrays = tuple[np.ndarray, np.ndarray, "DatasetInfo"]


@dataclass(frozen=True)
class DatasetInfo:
    """What a model needs to know about a dataset; mean and std are for pixels scaled to [0, 1]."""

    name: str
    num_classes: int
    in_shape: tuple[int, int, int]  # C, H, W
    mean: tuple[float, ...]
    std: tuple[float, ...]
    class_names: tuple[str, ...]


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
    """``data_dir`` alone when given; else the system dir (Fashion-MNIST), $EDGEFL_DATA/<name>,
    ./data/<name>."""
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
# name, classes, input shape, per-channel mean and std, class names
CIFAR10 = DatasetInfo("cifar10", 10, (3, 32, 32), (0.4914, 0.4822, 0.4465),
                      (0.2470, 0.2435, 0.2616), cifar.CIFAR10_CLASSES)
CIFAR100 = DatasetInfo("cifar100", 100, (3, 32, 32), (0.5071, 0.4865, 0.4409),
                       (0.2673, 0.2564, 0.2762), cifar.CIFAR100_CLASSES)
# statistics published with the dataset (BayesWatch/cinic-10)
CINIC10 = DatasetInfo("cinic10", 10, (3, 32, 32), (0.4789, 0.4723, 0.4305),
                      (0.2421, 0.2383, 0.2587), cifar.CIFAR10_CLASSES)

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
            "`python -m edgefl.data.fetch fashion-mnist`, or put the files in one of those "
            "directories."
        )
    else:
        how = f"Put the files in {dirs[0]}."
    raise _not_found(f"{name} ({'+'.join(splits)})", dirs, f"{files} (each may be .gz)", how)


def _load_idx(info: DatasetInfo, split: str, data_dir: Path | None) -> Arrays:
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
    return images[:, None], labels, info


def keep_dataset(name: str, data_dir: str | Path | None = None) -> bool:
    """Decode an IDX dataset's files (MNIST, Fashion-MNIST) now and keep them in this process
    (:func:`~edgefl.data.idx.keep_idx`), as :func:`load_arrays` would find them; False (nothing
    kept) for other datasets or where the files are missing."""
    key = name.strip().lower()
    if key not in _IDX_RAW_SUBDIR:
        return False
    folder = None if data_dir is None else Path(data_dir).expanduser()
    for split in SPLITS:
        try:
            directory = locate_idx(key, folder, (split,))
        except DataNotFoundError:
            return False
        for path in idx.find_idx_files(directory, split, _IDX_RAW_SUBDIR[key]) or ():
            idx.keep_idx(path)
    return True


def _load_cifar(info: DatasetInfo, split: str, data_dir: Path | None) -> Arrays:
    layout = _CIFAR_FILES[info.name]
    dirs = search_dirs(info.name, data_dir)
    for d in dirs:
        found = cifar.find_and_read(layout, d, split)
        if found is not None:
            return (*found, info)
    how = (
        "Download it from https://www.cs.toronto.edu/~kriz/cifar.html and extract it into "
        f"{dirs[0]}."
    )
    raise _not_found(f"{info.name} ({split})", dirs, layout.expected_files(), how)


def _load_cinic(info: DatasetInfo, split: str, data_dir: Path | None) -> Arrays:
    dirs = search_dirs(info.name, data_dir)
    for root in (r for d in dirs for r in (d, d / "cinic-10")):
        if (root / split).is_dir():
            x, y = read_image_folder(
                root / split, info.class_names, channels=3, size=info.in_shape[1:]
            )
            return x, y, info
    how = (
        "Download CINIC-10 from https://datashare.ed.ac.uk/handle/10283/3192 and extract it into "
        f"{dirs[0]}."
    )
    raise _not_found(
        f"{info.name} ({split})", dirs, f"{split}/<class>/*.png, optionally under cinic-10/", how
    )


def _load_synthetic(info: DatasetInfo, split: str, _data_dir: Path | None) -> Arrays:
    channels, side, _ = info.in_shape
    return (*synthetic.make_synthetic(split, channels, side), info)


# Filled as splits are read, so a test split reuses the train split's class list and pixel
# statistics instead of decoding the train images a second time.
_FOLDER_INFO: dict[Path, DatasetInfo] = {}


def _folder_root(path: str, data_dir: Path | None) -> Path:
    if not path and data_dir is None:
        raise ConfigError("imagefolder needs a root: 'imagefolder:/path/to/root' or data_dir")
    root = Path(path or data_dir).expanduser().resolve()
    if not root.is_dir():
        raise DataNotFoundError(
            f"{root} not found; imagefolder expects root/{{train,test}}/<class>/*.png"
        )
    return root


def _split_dir(root: Path, split: str) -> Path:
    """``root/<split>``; a root that holds class folders and no split folders is that split."""
    if (root / split).is_dir():
        return root / split
    if not any((root / s).is_dir() for s in SPLITS) and list_classes(root):
        return root
    raise DataNotFoundError(
        f"{root / split} not found; imagefolder expects root/{split}/<class>/*.png"
    )


def _read_folder_info(root: Path, split: str) -> tuple[np.ndarray, np.ndarray, DatasetInfo]:
    """Read a split; its class list and pixel statistics become the dataset's info."""
    directory = _split_dir(root, split)
    classes = list_classes(directory)
    x, y = read_image_folder(directory, classes)
    mean, std = pixel_stats(x)
    info = DatasetInfo(f"imagefolder:{root}", len(classes), x.shape[1:], mean, std, classes)
    _FOLDER_INFO[root] = info
    return x, y, info


def _folder_info(root: Path) -> DatasetInfo:
    """The train split's info (classes, pixel statistics); the test split's where there is no train
    split."""
    if root in _FOLDER_INFO:
        return _FOLDER_INFO[root]
    has_train = (root / "train").is_dir()
    return _read_folder_info(root, "train" if has_train else "test")[2]


def _load_folder(path: str, split: str, data_dir: Path | None) -> Arrays:
    root = _folder_root(path, data_dir)
    if split == "train" or (root not in _FOLDER_INFO and not (root / "train").is_dir()):
        return _read_folder_info(root, split)
    info = _folder_info(root)
    x, y = read_image_folder(
        _split_dir(root, split), info.class_names, channels=info.in_shape[0], size=info.in_shape[1:]
    )
    return x, y, info


def split_folder(path: str | Path | None, split: str) -> Path:
    """The folder of one split of an image folder: ``path/<split>``, or ``path`` itself when it
    holds the class folders directly."""
    if not path:
        raise ConfigError("imagefolder needs a folder: 'imagefolder:/path/to/root'")
    root = Path(path).expanduser().resolve()
    if not root.is_dir():
        raise DataNotFoundError(f"{root} is not a folder")
    return _split_dir(root, split)


def read_folder_for_model(
    directory: str | Path, channels: int | None
) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Images under ``directory/<class>/`` converted one by one to ``channels`` (a model's input),
    labels numbered by the sorted folder names, and those names. For inference: what a label
    means is decided by the caller, by name, against the model's own class names."""
    directory = Path(directory).expanduser()
    if not directory.is_dir():
        raise DataNotFoundError(f"{directory} is not a folder of <class>/*.png folders")
    classes = list_classes(directory)
    if not classes:
        raise DataNotFoundError(
            f"{directory} has no class folders (expected {directory}/<class>/*.png)"
        )
    x, y = read_image_folder(directory, classes, channels=channels)
    return x, y, classes


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
    load: Callable[[str, str, Path | None], Arrays]  # (text after the colon, split, data_dir)
    takes_path: bool = False


def _fixed(
    info: DatasetInfo, load: Callable[[DatasetInfo, str, Path | None], Arrays]
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
    """A dataset's info without loading it (an imagefolder's train split is read once for its
    statistics)."""
    source, path = _lookup(name)
    return source.info(path)


def load_arrays(name: str, split: str, data_dir: str | Path | None = None) -> Arrays:
    """One split ("train" or "test") of a registered dataset as numpy arrays and its info."""
    source, path = _lookup(name)
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
    x, y, info = source.load(path, split, None if data_dir is None else Path(data_dir).expanduser())
    log.info("loaded %s %s: %d samples", info.name, split, len(y))
    return x, y, info
