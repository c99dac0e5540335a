"""IDX files (MNIST, Fashion-MNIST), parsed with numpy so no download helper is needed."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np

from edgefl.errors import DataNotFoundError

MNIST_CLASSES = tuple(str(d) for d in range(10))
FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)  # fmt: skip

# The third byte of the magic number names the element type; IDX stores big-endian.
_IDX_DTYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_SPLIT_PREFIX = {"train": "train", "test": "t10k"}


def idx_file_names(split: str) -> tuple[str, str]:
    """The canonical (images, labels) file names of a split, without ``.gz``."""
    prefix = _SPLIT_PREFIX[split]
    return f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte"


def find_idx_files(directory: Path, split: str, raw_subdir: str) -> tuple[Path, Path] | None:
    """Locate a split's (images, labels) in ``directory`` or torchvision's ``<raw_subdir>/raw``.

    Accepts gzipped or plain files and the ``train-images.idx3-ubyte`` spelling that some
    mirrors use. Returns None unless both files are found.
    """
    found = []
    for canonical in idx_file_names(split):
        dotted = canonical.replace("-idx", ".idx")
        candidates = [
            folder / f"{stem}{suffix}"
            for folder in (directory, directory / raw_subdir / "raw")
            for stem in (canonical, dotted)
            for suffix in (".gz", "")
        ]
        hit = next((c for c in candidates if c.is_file()), None)
        if hit is None:
            return None
        found.append(hit)
    return found[0], found[1]


#: IDX files decoded by :func:`keep_idx`, by (path, size, modification time): this process, and
#: every process forked from it, reads them from memory while the file is unchanged.
_KEPT: dict[tuple[str, int, int], np.ndarray] = {}


def _identity(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path.resolve()), st.st_size, st.st_mtime_ns


def keep_idx(path: Path) -> None:
    """Decode ``path`` now and keep it in this process: later reads of the unchanged file copy it
    from memory instead of decompressing it again (Fashion-MNIST's training images: 0.3 s of CPU a
    read). A fork server does this once for the processes it forks
    (:mod:`edgefl.runtime.forkwarm`)."""
    _KEPT[_identity(path)] = _decode_idx(path)


def read_idx(path: Path) -> np.ndarray:
    """Read one IDX file (gzipped if its name ends in ``.gz``) into a native-endian array (a
    writable one of its own, also when the file was kept decoded: :func:`keep_idx`)."""
    if _KEPT:
        try:
            kept = _KEPT.get(_identity(path))
        except OSError:
            kept = None
        if kept is not None:
            return kept.copy()
    return _decode_idx(path)


def _decode_idx(path: Path) -> np.ndarray:
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, zlib.error) as exc:
        raise _corrupt(path, f"cannot decompress: {exc}") from exc
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise _corrupt(path, "bad magic number")
    dtype, ndim = _IDX_DTYPES[raw[2]], raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise _corrupt(path, "header is truncated")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    count = int(np.prod(dims, dtype=np.int64))
    if len(raw) - header != count * dtype.itemsize:
        raise _corrupt(
            path,
            f"header promises {count * dtype.itemsize} data bytes, file has {len(raw) - header}",
        )
    # astype copies, which also makes the array writable (frombuffer over bytes is read-only).
    return (
        np.frombuffer(raw, dtype=dtype, count=count, offset=header)
        .reshape(dims)
        .astype(dtype.newbyteorder("="))
    )


def _corrupt(path: Path, reason: str) -> DataNotFoundError:
    return DataNotFoundError(
        f"{path} is not a valid IDX file ({reason}); delete it and fetch it again"
    )
