"""Image folders laid out as ``<split>/<class>/*.png`` (CINIC-10 and user datasets)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from edgefl.errors import ConfigError, DataNotFoundError

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")
_GRAY_MODES = {"1", "L", "LA", "I", "I;16", "F"}


def list_classes(directory: Path) -> tuple[str, ...]:
    """Class names are the subfolder names, sorted, as torchvision's ImageFolder does."""
    return tuple(p.name for p in _class_dirs(directory))


def _class_dirs(directory: Path) -> list[Path]:
    # Hidden folders (.ipynb_checkpoints, .cache) are tool litter, not classes.
    return sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith("."))


def read_image_folder(
    directory: Path,
    class_names: tuple[str, ...],
    *,
    channels: int | None = None,
    size: tuple[int, int] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Decode every image under ``directory/<class>/`` into uint8 [N, C, H, W] and int64 labels.

    ``channels`` None means 1 if every image is grayscale, else 3 (grayscale images are
    replicated). Images are never resized: one of a different size than ``size`` (H, W), or
    than the first image, raises ConfigError naming it.
    """
    label_of = {name: i for i, name in enumerate(class_names)}
    files: list[Path] = []
    labels: list[int] = []
    for sub in _class_dirs(directory):
        if sub.name not in label_of:
            raise ConfigError(
                f"class folder {sub} is not one of the dataset's classes {list(class_names)}"
            )
        for f in sorted(sub.iterdir()):
            if f.suffix.lower() in IMAGE_EXTENSIONS:
                files.append(f)
                labels.append(label_of[sub.name])
    if not files:
        raise DataNotFoundError(f"no {'/'.join(IMAGE_EXTENSIONS)} images in {directory}/<class>/")
    log.info("decoding %d images from %s", len(files), directory)

    x: np.ndarray | None = None
    all_gray = True
    for i, f in enumerate(files):
        pixels = _read_pixels(f, channels)
        if x is None:
            size = size or pixels.shape[:2]
            x = np.empty((len(files), channels or 3, *size), dtype=np.uint8)
        if pixels.shape[:2] != tuple(size):
            height, width = pixels.shape[:2]
            raise ConfigError(
                f"{f} is {width}x{height} but the dataset's images are {size[1]}x{size[0]}; "
                "resize all images to one size first"
            )
        all_gray &= pixels.ndim == 2
        # A grayscale image broadcasts over the channels, exactly as PIL's L -> RGB would.
        x[i] = pixels if pixels.ndim == 2 else pixels.transpose(2, 0, 1)
    if channels is None and all_gray:
        x = x[:, :1].copy()
    return x, np.asarray(labels, dtype=np.int64)


def _read_pixels(path: Path, channels: int | None) -> np.ndarray:
    """H x W for a grayscale image (or when channels == 1), else H x W x 3."""
    from PIL import Image  # the [images] layer (pillow): imported only where files are decoded

    try:
        with Image.open(path) as im:
            gray = channels == 1 or (channels is None and im.mode in _GRAY_MODES)
            return np.asarray(im.convert("L" if gray else "RGB"))
    except OSError as exc:  # PIL's UnidentifiedImageError, truncated files
        raise DataNotFoundError(f"{path} cannot be read as an image: {exc}") from exc
