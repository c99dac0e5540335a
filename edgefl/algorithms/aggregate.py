"""Aggregation primitives shared by server halves. Everything aligns tensors by name."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np


def weighted_average(items: Iterable[tuple[Mapping[str, np.ndarray], float]]) -> dict[str, np.ndarray]:
    """Σ wᵢ·aᵢ / Σ wᵢ per name, folded as the items arrive (memory does not grow with devices).

    Integer tensors (BatchNorm's ``num_batches_tracked``) are averaged and rounded back.
    Every item must carry the same names and shapes.
    """
    sums: dict[str, np.ndarray] = {}
    dtypes: dict[str, np.dtype] = {}
    total = 0.0
    for arrays, weight in items:
        if weight < 0:
            raise ValueError("weights must be non-negative")
        if not sums:
            sums = {k: np.asarray(v, np.float64) * weight for k, v in arrays.items()}
            dtypes = {k: np.asarray(v).dtype for k, v in arrays.items()}
        else:
            if arrays.keys() != sums.keys():
                raise ValueError("cannot average payloads with different tensor names")
            for k, v in arrays.items():
                sums[k] += np.asarray(v, np.float64) * weight
        total += weight
    if not sums:
        return {}
    if total <= 0:
        raise ValueError("the weights sum to zero")
    out = {}
    for k, s in sums.items():
        mean = s / total
        out[k] = np.rint(mean).astype(dtypes[k]) if dtypes[k].kind in "iu" else mean.astype(dtypes[k])
    return out
