"""The Gaussian mechanisms: clip, then add noise calibrated to the clip
(:mod:`edgefl.privacy.declare`).

Noise is drawn in float64 from a numpy generator the caller seeds; a device seeds it per
(device, round) apart from the training streams, so a run repeats on any transport.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np
import torch

from edgefl.data import ArrayDataset
from edgefl.privacy.declare import SENSITIVITY, ClassStats, Release

#: A class is reported when its noisy count reaches this many standard deviations of the count
#: noise (post-processing: it spends nothing; a class a device does not hold passes with
#: probability 0.13 %).
PRESENT_SIGMAS = 3.0


def noise_std(noise_multiplier: float, clip: float) -> float:
    """Standard deviation of the noise on a part clipped to ``clip`` (sensitivity 2·clip)."""
    return noise_multiplier * SENSITIVITY * clip


def clip_rows(vectors: np.ndarray, clip: float) -> np.ndarray:
    """Each row scaled down to L2 norm at most ``clip`` (float64)."""
    v = np.asarray(vectors, np.float64)
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    return v * np.minimum(1.0, clip / np.maximum(norms, 1e-300))


def whole_names(arrays: Mapping[str, np.ndarray], release: Release) -> list[str]:
    """The float arrays of ``arrays`` in the release's ``whole`` part, in sorted order."""
    return sorted(
        k for k, v in arrays.items() if release.in_whole(k) and np.asarray(v).dtype.kind == "f"
    )


def reference_of(name: str, array: np.ndarray, release: Release,
                 received: Mapping[str, np.ndarray]) -> np.ndarray:
    ref = received.get(name) if release.reference == "received" else None
    if ref is None or np.shape(ref) != np.shape(array):
        return np.zeros(np.shape(array), np.float64)
    return np.asarray(ref, np.float64)


def update_norm(arrays: Mapping[str, np.ndarray], release: Release,
                received: Mapping[str, np.ndarray]) -> float:
    """L2 norm of the whole part's distance from its reference (one norm over every array)."""
    total = 0.0
    for k in whole_names(arrays, release):
        total += float(
            np.sum(
                (np.asarray(arrays[k], np.float64) - reference_of(k, arrays[k], release, received))
                ** 2
            )
        )
    return math.sqrt(total)


def clip_whole(
    arrays: Mapping[str, np.ndarray], release: Release, received: Mapping[str, np.ndarray],
    clip: float
) -> dict[str, np.ndarray]:
    """The whole part moved toward its reference until its distance is at most ``clip`` (float64);
    the other arrays unchanged."""
    norm = update_norm(arrays, release, received)
    scale = min(1.0, clip / norm) if norm > 0 else 1.0
    out = dict(arrays)
    for k in whole_names(arrays, release):
        ref = reference_of(k, arrays[k], release, received)
        out[k] = ref + (np.asarray(arrays[k], np.float64) - ref) * scale
    return out


def private_whole(
    arrays: Mapping[str, np.ndarray],
    release: Release,
    received: Mapping[str, np.ndarray],
    clip: float,
    noise_multiplier: float,
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """Local DP of the whole part: clipped to ``clip`` around its reference, plus N(0, (z·2C)²)
    on every coordinate, cast back to each array's dtype."""
    clipped = clip_whole(arrays, release, received, clip)
    std = noise_std(noise_multiplier, clip)
    out = dict(arrays)
    for k in whole_names(arrays, release):
        out[k] = (clipped[k] + rng.normal(0.0, std, np.shape(clipped[k]))).astype(
            np.asarray(arrays[k]).dtype
        )
    return out


@torch.no_grad()
def class_sums(
    sample_vectors: Callable[[torch.Tensor], Mapping[str, torch.Tensor]],
    model: torch.nn.Module,
    data: ArrayDataset,
    stats: ClassStats,
    num_classes: int,
    clip: float,
    batch_size: int = 256,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Per-class sums of each sample's vector, the concatenation of its blocks clipped to L2
    norm ``clip`` (each sample once, model in eval mode), and per-class counts."""
    was_training = model.training
    model.eval()
    sums: dict[str, np.ndarray] = {}
    counts = np.zeros(num_classes, np.float64)
    try:
        for x, y in data.batches(batch_size, shuffle=False):
            vectors = sample_vectors(x)
            rows = [vectors[b].detach().double().flatten(1).cpu().numpy() for b in stats.blocks]
            widths = [r.shape[1] for r in rows]
            clipped = clip_rows(np.concatenate(rows, axis=1), clip)
            labels = y.cpu().numpy()
            start = 0
            for b, w in zip(stats.blocks, widths, strict=True):
                if b not in sums:
                    sums[b] = np.zeros((num_classes, w), np.float64)
                np.add.at(sums[b], labels, clipped[:, start : start + w])
                start += w
            np.add.at(counts, labels, 1.0)
    finally:
        model.train(was_training)
    return sums, counts


def private_class_stats(
    sums: Mapping[str, np.ndarray],
    counts: np.ndarray,
    stats: ClassStats,
    clip: float,
    noise_multiplier: float,
    rng: np.random.Generator,
    dtypes: Mapping[str, np.dtype],
) -> dict[str, np.ndarray]:
    """The uplink arrays of ``stats`` from noisy sums (std z·2C) and noisy counts (std z·2):
    classes whose noisy count is below :data:`PRESENT_SIGMAS` count-noise deviations are reported
    absent (count 0, zero rows, no row in a ``classes`` layout). With ``reduce="mean"`` each
    class's noisy mean (its rows of every block, concatenated) is projected onto the ball of
    radius ``clip``: the true mean of vectors clipped to ``clip`` lies in that ball, a convex set,
    so the projection never moves the release farther from it (the diagnostics of
    benchmarks/privacy/results.md measure by how much it brings it closer). Everything after the
    noise is post-processing."""
    count_std = noise_multiplier * SENSITIVITY
    noisy_counts = np.asarray(counts, np.float64) + rng.normal(0.0, count_std, np.shape(counts))
    present = noisy_counts >= max(1.0, PRESENT_SIGMAS * count_std)
    denominator = np.maximum(noisy_counts, 1.0)[:, None]
    std = noise_std(noise_multiplier, clip)
    rows = np.flatnonzero(present)
    values = {}
    for b in stats.blocks:
        noisy = np.asarray(sums[b], np.float64) + rng.normal(0.0, std, np.shape(sums[b]))
        values[b] = noisy / denominator if stats.reduce == "mean" else noisy
    if stats.reduce == "mean":
        norms = np.sqrt(sum(np.sum(v**2, axis=1) for v in values.values()))[:, None]
        scale = np.minimum(1.0, clip / np.maximum(norms, 1e-300))
        values = {b: v * scale for b, v in values.items()}
    out: dict[str, np.ndarray] = {}
    for b, value in values.items():
        value = np.where(present[:, None], value, 0.0)
        out[b] = (value[rows] if stats.classes else value).astype(dtypes.get(b, np.float32))
    if stats.counts:
        dtype = np.dtype(dtypes.get(stats.counts, np.int64))
        kept = np.where(present, noisy_counts, 0.0)
        out[stats.counts] = (np.rint(kept) if dtype.kind in "iu" else kept).astype(dtype)
    if stats.classes:
        out[stats.classes] = rows.astype(dtypes.get(stats.classes, np.int64))
    return out
