"""Splitting a dataset's indices among clients, and carving out a server-side public set.

Every function returns int64 index arrays, each sorted, and is a pure function of its
arguments: the only randomness is ``np.random.default_rng(seed)``.
"""

from __future__ import annotations

import logging

import numpy as np

from edgefl.errors import ConfigError, UnknownNameError

log = logging.getLogger(__name__)

SCHEMES = ("iid", "dirichlet", "shards")
_DIRICHLET_ATTEMPTS = 1000


def iid_partition(num_samples: int, num_clients: int, seed: int) -> list[np.ndarray]:
    """A random split into ``num_clients`` parts whose sizes differ by at most one."""
    _check_clients(num_clients, num_samples)
    return _sorted(
        np.array_split(np.random.default_rng(seed).permutation(num_samples), num_clients)
    )


def dirichlet_partition(
    labels: np.ndarray, num_clients: int, alpha: float, seed: int, min_size: int = 10
) -> list[np.ndarray]:
    """The per-class Dirichlet split of Hsu et al. (2019), as in NIID-Bench.

    Each class is divided among the clients in Dirichlet(alpha) proportions; small alpha
    gives each client few classes. Draws repeat until every client holds ``min_size``.
    """
    labels = _check_labels(labels)
    _check_clients(num_clients, labels.size)
    if not alpha > 0:  # also rejects NaN
        raise ConfigError(f"alpha must be > 0, got {alpha}")
    if min_size < 0 or min_size * num_clients > labels.size:
        raise ConfigError(
            f"min_size={min_size} for {num_clients} clients needs more than {labels.size} samples"
        )
    rng = np.random.default_rng(seed)
    by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    for attempt in range(1, _DIRICHLET_ATTEMPTS + 1):
        parts = _dirichlet_draw(by_class, num_clients, alpha, labels.size, rng)
        if min(p.size for p in parts) >= min_size:
            log.debug(
                "dirichlet split (alpha=%s) met min_size=%d on draw %d", alpha, min_size, attempt
            )
            return _sorted(parts)
    raise ConfigError(
        f"no Dirichlet(alpha={alpha}) split in {_DIRICHLET_ATTEMPTS} draws gave each of "
        f"{num_clients} "
        f"clients at least {min_size} samples; lower min_size or raise alpha"
    )


def _dirichlet_draw(
    by_class: list[np.ndarray],
    num_clients: int,
    alpha: float,
    num_samples: int,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    pieces: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    sizes = np.zeros(num_clients, dtype=np.int64)
    for members in by_class:
        # A client already holding its fair share takes no more (NIID-Bench does the same),
        # which keeps one client from collecting most of the data at small alpha.
        has_room = sizes < num_samples / num_clients
        weights = np.where(has_room, rng.dirichlet(np.full(num_clients, alpha)), 0.0)
        if weights.sum() == 0:  # every share with room underflowed at tiny alpha
            weights = has_room.astype(float)
        cuts = (np.cumsum(weights / weights.sum()) * members.size).astype(np.int64)[:-1]
        for client, piece in enumerate(np.split(rng.permutation(members), cuts)):
            pieces[client].append(piece)
            sizes[client] += piece.size
    return [np.concatenate(p) for p in pieces]


def shard_partition(
    labels: np.ndarray, num_clients: int, classes_per_client: int, seed: int
) -> list[np.ndarray]:
    """Each client gets shards of exactly ``classes_per_client`` distinct classes.

    As in McMahan et al. and FedHeNN, every class used is cut into equal shards that
    together hold all its samples; the classes share the ``num_clients * k`` shards as
    evenly as possible (a random subset of classes when there are fewer shards than classes).
    Unlike dealing shards blindly, no client ever receives two shards of one class.
    """
    labels = _check_labels(labels)
    _check_clients(num_clients, labels.size)
    classes = np.unique(labels)
    k = classes_per_client
    if not 1 <= k <= classes.size:
        raise ConfigError(
            f"classes_per_client must be between 1 and the {classes.size} classes present, got {k}"
        )
    rng = np.random.default_rng(seed)

    total = num_clients * k
    remaining = np.full(classes.size, total // classes.size)
    remaining[rng.permutation(classes.size)[: total % classes.size]] += 1
    shards = []
    for c, count in zip(classes, remaining, strict=True):
        members = rng.permutation(np.flatnonzero(labels == c))
        if count > members.size:
            raise ConfigError(
                f"class {c} has {members.size} samples, too few for {count} shards; "
                "use fewer clients or fewer classes_per_client"
            )
        shards.append(np.array_split(members, count) if count else [])

    parts = []
    for clients_left in range(num_clients, 0, -1):
        # A class with a shard left for every client still to serve must go to each of them,
        # this one included. Taking those first keeps the rest solvable: at every step the
        # shards left sum to clients_left * k and no class has more than clients_left.
        forced = np.flatnonzero(remaining == clients_left)
        optional = np.flatnonzero((remaining > 0) & (remaining < clients_left))
        weights = remaining[optional] / remaining[optional].sum() if optional.size else None
        picked = rng.choice(optional, size=k - forced.size, replace=False, p=weights)
        chosen = np.concatenate([forced, picked])
        parts.append(np.concatenate([shards[c].pop() for c in chosen]))
        remaining[chosen] -= 1
    return _sorted(parts)


def carve_public(
    labels: np.ndarray, fraction: float, seed: int, stratified: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Split off ``round(fraction * N)`` samples for the server; returns (public, remaining).

    Stratified, each class contributes in proportion to its size (largest remainders
    settle the rounding), so the public set mirrors the label distribution.
    """
    labels = _check_labels(labels)
    if not 0 < fraction < 1:
        raise ConfigError(f"fraction must lie in (0, 1), got {fraction}")
    size = round(fraction * labels.size)
    if not 1 <= size < labels.size:
        raise ConfigError(
            f"fraction={fraction} of {labels.size} samples leaves {size} public samples"
        )
    rng = np.random.default_rng(seed)
    if stratified:
        classes, counts = np.unique(labels, return_counts=True)
        quotas = _largest_remainder(counts, size)
        public = np.concatenate(
            [
                rng.choice(np.flatnonzero(labels == c), q, replace=False)
                for c, q in zip(classes, quotas, strict=True)
            ]
        )
    else:
        public = rng.choice(labels.size, size, replace=False)
    public = np.sort(public).astype(np.int64)
    return public, np.setdiff1d(np.arange(labels.size, dtype=np.int64), public, assume_unique=True)


def _largest_remainder(counts: np.ndarray, total: int) -> np.ndarray:
    exact = counts * (total / counts.sum())
    quotas = np.floor(exact).astype(np.int64)
    by_remainder = np.argsort(-(exact - quotas), kind="stable")
    quotas[by_remainder[: total - quotas.sum()]] += 1
    return quotas


def partition(
    labels: np.ndarray,
    num_clients: int,
    scheme: str,
    *,
    alpha: float | None = None,
    classes_per_client: int | None = None,
    seed: int,
    min_size: int = 10,
) -> list[np.ndarray]:
    """Split by ``scheme``: "iid", "dirichlet" (needs alpha) or "shards" (needs
    classes_per_client)."""
    if scheme == "iid":
        return iid_partition(len(labels), num_clients, seed)
    if scheme == "dirichlet":
        if alpha is None:
            raise ConfigError(
                "the dirichlet scheme needs alpha (0.1 is very skewed, 100 nearly iid)"
            )
        return dirichlet_partition(labels, num_clients, alpha, seed, min_size)
    if scheme == "shards":
        if classes_per_client is None:
            raise ConfigError("the shards scheme needs classes_per_client")
        return shard_partition(labels, num_clients, classes_per_client, seed)
    raise UnknownNameError("partition", scheme, SCHEMES)


def label_distribution(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """Label counts per client, int64 [clients, classes]."""
    labels = _check_labels(labels)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ConfigError(
            f"labels must lie in [0, {num_classes}), got {labels.min()}..{labels.max()}"
        )
    counts = [np.bincount(labels[p], minlength=num_classes) for p in parts]
    return (
        np.stack(counts).astype(np.int64) if counts else np.zeros((0, num_classes), dtype=np.int64)
    )


def _check_labels(labels: np.ndarray) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or (labels.size and labels.dtype.kind not in "iu"):
        raise ConfigError(
            f"labels must be a 1-D integer array, got {labels.dtype} of shape {labels.shape}"
        )
    return labels.astype(np.int64, copy=False)


def _check_clients(num_clients: int, num_samples: int) -> None:
    if not 1 <= num_clients <= num_samples:
        raise ConfigError(
            f"num_clients must be between 1 and the {num_samples} samples, got {num_clients}"
        )


def _sorted(parts: list[np.ndarray]) -> list[np.ndarray]:
    return [np.sort(p).astype(np.int64, copy=False) for p in parts]
