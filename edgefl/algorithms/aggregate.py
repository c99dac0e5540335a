"""Aggregation primitives shared by server halves. Everything aligns tensors by name."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np


def weighted_average(
    items: Iterable[tuple[Mapping[str, np.ndarray], float]],
) -> dict[str, np.ndarray]:
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
        out[k] = (
            np.rint(mean).astype(dtypes[k]) if dtypes[k].kind in "iu" else mean.astype(dtypes[k])
        )
    return out


# --- bounded influence: norm bounds and robust rules (issue 19) ---------------------------------

Rule = Literal["mean", "median", "trimmed_mean"]


@dataclass(frozen=True)
class Defences:
    """Options of a method whose server combines updates, against a well-formed but malicious one.

    ``aggregator``: ``mean`` (the method's own weighted mean), ``median`` (coordinate-wise,
    unweighted) or ``trimmed_mean`` (per coordinate, the ``trim`` share of the largest and of the
    smallest values dropped, unweighted mean of the rest). ``clip_norm`` > 0 bounds the L2 norm of
    each device's contribution: a weight update's distance from the current global model, or each
    per-class knowledge vector's distance from the current global one (its own norm while none).
    """

    aggregator: Rule = "mean"
    trim: float = 0.2
    clip_norm: float = 0.0

    def __post_init__(self):
        if self.aggregator not in ("mean", "median", "trimmed_mean"):
            raise ValueError("aggregator must be mean, median or trimmed_mean")
        if not 0.0 <= self.trim < 0.5:
            raise ValueError("trim must be in [0, 0.5)")
        if not (self.clip_norm >= 0 and math.isfinite(self.clip_norm)):
            raise ValueError("clip_norm must be a finite number >= 0 (0 = no bound)")


def defences_of(options: object) -> Defences:
    """The defences a method's options carry (none for options that do not offer them)."""
    return options if isinstance(options, Defences) else Defences()


def clip_to_norm(vector: np.ndarray, reference: np.ndarray | None, max_norm: float) -> np.ndarray:
    """``vector`` moved toward ``reference`` (or 0) so that their distance is at most
    ``max_norm``."""
    ref = (
        np.zeros_like(vector, np.float64)
        if reference is None
        else np.asarray(reference, np.float64)
    )
    delta = np.asarray(vector, np.float64) - ref
    norm = float(np.linalg.norm(delta))
    if max_norm <= 0 or norm <= max_norm:
        return np.asarray(vector)
    return (ref + delta * (max_norm / norm)).astype(np.asarray(vector).dtype)


def clip_update(
    arrays: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray], max_norm: float
) -> dict[str, np.ndarray]:
    """Weights whose update (their float tensors' distance from ``reference``, one L2 norm over
    all of them) is scaled down to ``max_norm``; integer tensors are kept."""
    floats = [k for k, v in arrays.items() if np.asarray(v).dtype.kind == "f" and k in reference]
    norm = math.sqrt(
        sum(float(np.sum((np.asarray(arrays[k], np.float64) - reference[k]) ** 2)) for k in floats)
    )
    if max_norm <= 0 or norm <= max_norm:
        return dict(arrays)
    scale = max_norm / norm
    out = dict(arrays)
    for k in floats:
        ref = np.asarray(reference[k], np.float64)
        out[k] = (ref + (np.asarray(arrays[k], np.float64) - ref) * scale).astype(
            np.asarray(arrays[k]).dtype
        )
    return out


def robust_stack(
    values: Sequence[np.ndarray],
    rule: Rule,
    trim: float = 0.2,
    weights: Sequence[float] | None = None,
) -> np.ndarray:
    """Combine same-shaped arrays coordinate by coordinate (float64 result)."""
    stack = np.stack([np.asarray(v, np.float64) for v in values])
    if rule == "median":
        return np.median(stack, axis=0)
    if rule == "trimmed_mean":
        k = int(math.floor(trim * len(values)))
        ordered = np.sort(stack, axis=0)
        return ordered[k : len(values) - k].mean(axis=0)
    w = np.ones(len(values)) if weights is None else np.asarray(weights, np.float64)
    return np.tensordot(w / w.sum(), stack, axes=1)


def robust_average(
    items: Sequence[tuple[Mapping[str, np.ndarray], float]], rule: Rule, trim: float = 0.2
) -> dict[str, np.ndarray]:
    """:func:`weighted_average` for ``mean``; otherwise the robust rule per name (unweighted:
    a weight is the device's own claim, and a robust rule must not trust it)."""
    if rule == "mean":
        return weighted_average(items)
    if not items:
        return {}
    names = items[0][0].keys()
    if any(a.keys() != names for a, _ in items):
        raise ValueError("cannot combine payloads with different tensor names")
    out = {}
    for k in names:
        dtype = np.asarray(items[0][0][k]).dtype
        combined = robust_stack([a[k] for a, _ in items], rule, trim)
        out[k] = np.rint(combined).astype(dtype) if dtype.kind in "iu" else combined.astype(dtype)
    return out
