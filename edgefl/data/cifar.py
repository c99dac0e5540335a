"""CIFAR-10 and CIFAR-100 from the files the user downloaded (binary or python version)."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgefl.errors import DataNotFoundError

CIFAR10_CLASSES = (
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
)  # fmt: skip
CIFAR100_CLASSES = (
    "apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle", "bicycle",
    "bottle", "bowl", "boy", "bridge", "bus", "butterfly", "camel", "can", "castle",
    "caterpillar", "cattle", "chair", "chimpanzee", "clock", "cloud", "cockroach", "couch",
    "crab", "crocodile", "cup", "dinosaur", "dolphin", "elephant", "flatfish", "forest", "fox",
    "girl", "hamster", "house", "kangaroo", "keyboard", "lamp", "lawn_mower", "leopard", "lion",
    "lizard", "lobster", "man", "maple_tree", "motorcycle", "mountain", "mouse", "mushroom",
    "oak_tree", "orange", "orchid", "otter", "palm_tree", "pear", "pickup_truck", "pine_tree",
    "plain", "plate", "poppy", "porcupine", "possum", "rabbit", "raccoon", "ray", "road",
    "rocket", "rose", "sea", "seal", "shark", "shrew", "skunk", "skyscraper", "snail", "snake",
    "spider", "squirrel", "streetcar", "sunflower", "sweet_pepper", "table", "tank",
    "telephone", "television", "tiger", "tractor", "train", "trout", "tulip", "turtle",
    "wardrobe", "whale", "willow_tree", "wolf", "woman", "worm",
)  # fmt: skip

_PIXELS = 3 * 32 * 32


@dataclass(frozen=True)
class CifarLayout:
    """Where one CIFAR variant keeps its files, in both published versions."""

    bin_dir: str
    bin_files: dict[str, tuple[str, ...]]
    label_bytes: int  # CIFAR-100 stores coarse then fine label; the fine one is the last byte
    py_dir: str
    py_files: dict[str, tuple[str, ...]]
    py_label_key: bytes

    def expected_files(self) -> str:
        files = ", ".join(f for fs in self.bin_files.values() for f in fs)
        return f"{self.bin_dir}/ with {files} (binary version), or {self.py_dir}/ (python version)"


CIFAR10_FILES = CifarLayout(
    bin_dir="cifar-10-batches-bin",
    bin_files={
        "train": tuple(f"data_batch_{i}.bin" for i in range(1, 6)),
        "test": ("test_batch.bin",),
    },
    label_bytes=1,
    py_dir="cifar-10-batches-py",
    py_files={"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)},
    py_label_key=b"labels",
)
CIFAR100_FILES = CifarLayout(
    bin_dir="cifar-100-binary",
    bin_files={"train": ("train.bin",), "test": ("test.bin",)},
    label_bytes=2,
    py_dir="cifar-100-python",
    py_files={"train": ("train",), "test": ("test",)},
    py_label_key=b"fine_labels",
)


def find_and_read(
    layout: CifarLayout, root: Path, split: str
) -> tuple[np.ndarray, np.ndarray] | None:
    """Read a split from ``root`` (which holds the extracted folder, or is that folder)."""
    versions = (  # binary first: it needs no unpickling
        (layout.bin_dir, layout.bin_files[split], lambda p: _read_binary(p, layout.label_bytes)),
        (layout.py_dir, layout.py_files[split], lambda p: _read_python(p, layout.py_label_key)),
    )
    for subdir, names, read in versions:
        for folder in (root / subdir, root):
            paths = [folder / name for name in names]
            if all(p.is_file() for p in paths):
                parts = [read(p) for p in paths]
                return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])
    return None


def _read_binary(path: Path, label_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    raw = np.fromfile(path, dtype=np.uint8)
    record = label_bytes + _PIXELS
    if raw.size == 0 or raw.size % record:
        raise DataNotFoundError(
            f"{path} is not a CIFAR binary file ({raw.size} bytes is not a multiple of "
            f"the {record}-byte record); delete it and extract the archive again"
        )
    rows = raw.reshape(-1, record)
    images = rows[:, label_bytes:].reshape(-1, 3, 32, 32).copy()
    return images, rows[:, label_bytes - 1].astype(np.int64)


class _ArraysOnlyUnpickler(pickle.Unpickler):
    """Resolves only what a CIFAR batch holds (numpy arrays, lists, bytes)."""

    _ALLOWED = {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


def _read_python(path: Path, label_key: bytes) -> tuple[np.ndarray, np.ndarray]:
    # Unpickling is acceptable here only because the user placed this file on their own disk
    # (the official "python version" archive). Network data is never unpickled in edgefl, and
    # even here the unpickler refuses anything but arrays.
    try:
        with path.open("rb") as f:
            batch = _ArraysOnlyUnpickler(f, encoding="bytes").load()
        data = np.asarray(batch[b"data"], dtype=np.uint8)
        labels = np.asarray(batch[label_key], dtype=np.int64)
    except (pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError) as exc:
        raise DataNotFoundError(
            f"{path} is not a CIFAR python batch ({exc}); delete it and extract the archive again"
        ) from exc
    if data.ndim != 2 or data.shape != (labels.size, _PIXELS):
        raise DataNotFoundError(f"{path} holds data of shape {data.shape}, expected (N, {_PIXELS})")
    return data.reshape(-1, 3, 32, 32), labels
