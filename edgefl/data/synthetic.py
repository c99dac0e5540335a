"""A small, fixed, learnable image dataset so tests and demos need no downloads."""

from __future__ import annotations

import numpy as np

NUM_CLASSES = 10
SIZES = {"train": 2000, "test": 500}
# Measured once on the train split of both variants (per channel they agree to 0.005).
PIXEL_MEAN, PIXEL_STD = 0.500, 0.292
_SEED = 20240611
_BLOCK = 4  # templates are drawn coarse and upsampled, so the classes differ in shapes, not pixels
_AMPLITUDE = 45.0  # class signal around mid-grey; with the noise and shifts below it is not trivial
_NOISE_STD = 80.0
_MAX_SHIFT = 3


def make_synthetic(split: str, channels: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Images uint8 [N, channels, side, side] and balanced int64 labels, identical on every call.

    Every class is a fixed random blocky template; a sample is its class template, shifted
    by up to a few pixels (circularly), plus strong pixel noise. Both splits share the
    templates and draw shifts and noise independently.
    """
    templates = np.random.default_rng(_SEED).uniform(
        -_AMPLITUDE, _AMPLITUDE, size=(NUM_CLASSES, channels, side // _BLOCK, side // _BLOCK)
    )
    templates = 128.0 + templates.repeat(_BLOCK, axis=2).repeat(_BLOCK, axis=3)

    rng = np.random.default_rng([_SEED, channels, side, list(SIZES).index(split)])
    n = SIZES[split]
    labels = rng.permutation(np.arange(n) % NUM_CLASSES)
    shifts = rng.integers(-_MAX_SHIFT, _MAX_SHIFT + 1, size=(n, 2))
    clean = np.stack(
        [np.roll(templates[c], tuple(s), axis=(1, 2)) for c, s in zip(labels, shifts, strict=True)]
    )
    noisy = clean + rng.normal(0.0, _NOISE_STD, size=(n, channels, side, side))
    return np.clip(np.rint(noisy), 0, 255).astype(np.uint8), labels.astype(np.int64)
