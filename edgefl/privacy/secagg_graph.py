"""The neighbour graph of secure aggregation (SecAgg+, Bell et al., CCS 2020).

Each device masks with, and shares its secrets among, only its neighbours in a k-regular graph
over the round's roster (the devices that advertised keys): k key agreements, k mask expansions
and k sealed pairs of shares a device, instead of n - 1 on the full graph. The graph is a
**random Harary graph**: the roster is put in a random order on a ring, and each device is joined
to the k/2 devices on either side of it. The order comes from a 32-byte seed the server draws
after the keys are advertised (so it cannot be fitted to them in advance by a server that follows
the protocol) and announces in public: position of d = SHA-256(context ‖ seed ‖ d), sorted. Every
device rebuilds the graph from the seed, checks it (:func:`check_graph`) and checks that the
neighbours the server names for it are the graph's.

**Choosing k** (``secagg_neighbours``): ``auto`` (the default) keeps the full graph for rounds of
fewer than :data:`FULL_BELOW` devices (a graph saves little there, and a small fleet's fractions
round to one or two devices, which the bounds below cannot lean on), and above that takes the
least even k that passes the paper's two tests for a semi-honest server (its Section 3, with its
statistical security σ = 40 and correctness η = 20), assuming at most :data:`CORRUPT` of the
devices collude with the server and at most :data:`DROPOUT` drop out:

1. the graph stays connected once the colluding and dropped devices are removed, except with
   probability < 2^-41 (a union bound: cutting a Harary ring takes k/2 bad devices in a row in
   two places, n·(n - k - 1)/2 pairs of places);
2. with t = ⌈threshold·(k + 1)⌉ shares needed of the k + 1 a device's secrets are split into
   (its neighbours' and its own), any device has t or more colluding neighbours with probability
   < 2^-41/n (the server would rebuild its secrets), and fewer than t surviving holders with
   probability < 2^-20/n (the round would fail), both hypergeometric.

No such k below n - 1: the full graph. ``full``: always the full graph; an even number ≥ 2: that k
(the full graph when k ≥ n - 1).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from functools import lru_cache

from edgefl.errors import ConfigError
from edgefl.privacy.secagg_crypto import SecAggError

#: Bytes of the graph's seed.
SEED_BYTES = 32
#: ``auto`` keeps the full graph below this many devices.
FULL_BELOW = 50
#: ``auto``'s design point: the fractions of a round's devices assumed colluding and dropping out.
CORRUPT, DROPOUT = 0.1, 0.1
#: ``auto``'s statistical security and correctness parameters (bits), as in the paper.
SIGMA, ETA = 40, 20


def parse_neighbours(value: object) -> str:
    """``auto``, ``full`` or an even number ≥ 2 (as text); ConfigError otherwise."""
    text = str(value).strip().lower()
    if text in ("auto", "full"):
        return text
    try:
        k = int(text)
    except ValueError:
        k = -1
    if k < 2 or k % 2:
        raise ConfigError(
            f"secagg_neighbours={value!r}: choose auto, full or an even number of neighbours ≥ 2 "
            "(a Harary graph of odd degree needs an even fleet)"
        )
    return str(k)


def degree_for(choice: str, n: int, threshold: float) -> int:
    """The number of neighbours k of each device in a round of ``n`` devices (n - 1: the full
    graph) for the ``secagg_neighbours`` choice and the threshold fraction."""
    if n < 2:
        raise SecAggError(f"a roster of {n} device(s): secure aggregation needs 2 or more")
    if choice == "full":
        return n - 1
    if choice == "auto":
        return n - 1 if n < FULL_BELOW else auto_degree(n, threshold)
    return min(int(choice), n - 1)


def threshold_of(k: int, fraction: float) -> int:
    """The shares needed (t) of the k + 1 a device's secrets are split into, at least 2."""
    return max(2, math.ceil(fraction * (k + 1) - 1e-9))


@lru_cache(maxsize=256)
def auto_degree(n: int, threshold: float) -> int:
    """The least even k < n - 1 that passes the tests of the module's docstring (else n - 1)."""
    corrupt, dropped = math.floor(CORRUPT * n + 1e-9), math.floor(DROPOUT * n + 1e-9)
    for k in range(2, n - 1, 2):
        if _log_disconnected(n, k, corrupt + dropped) >= -(SIGMA + 1) * math.log(2):
            continue
        t = threshold_of(k, threshold)
        if _tail(n - 1, corrupt, k, t) >= 2.0 ** -(SIGMA + 1) / n:
            continue  # t or more colluding neighbours
        if _tail(n - 1, dropped, k, k + 2 - t) >= 2.0**-ETA / n:
            continue  # more than k + 1 - t neighbours dropped: fewer than t holders left
        return k
    return n - 1


def _log_lchoose(a: int, b: int) -> float:
    return math.lgamma(a + 1) - math.lgamma(b + 1) - math.lgamma(a - b + 1)


def _log_disconnected(n: int, k: int, bad: int) -> float:
    """log of a bound on P[removing ``bad`` random devices disconnects a random Harary graph]."""
    if k > bad:
        return -math.inf
    pairs = math.log(n) + math.log(n - k - 1) - math.log(2)
    return pairs + _log_lchoose(bad, k) - _log_lchoose(n, k)


def _tail(population: int, marked: int, draws: int, at_least: int) -> float:
    """P[X ≥ at_least] for X hypergeometric: ``draws`` of ``population``, ``marked`` of them
    marked."""
    total = 0.0
    for x in range(max(at_least, 0), min(marked, draws) + 1):
        if draws - x <= population - marked:
            total += math.exp(
                _log_lchoose(marked, x)
                + _log_lchoose(population - marked, draws - x)
                - _log_lchoose(population, draws)
            )
    return total


def harary_graph(ids: Sequence[str], k: int, seed: bytes, context: str) -> dict[str, set[str]]:
    """device → its k neighbours: the random Harary graph of the ids (any order) under ``seed``;
    the full graph when k ≥ n - 1."""
    if len(seed) != SEED_BYTES:
        raise SecAggError(f"a graph seed of {len(seed)} bytes (must be {SEED_BYTES})")
    n = len(ids)
    if k >= n - 1:
        return {d: set(ids) - {d} for d in ids}
    if k < 2 or k % 2:
        raise SecAggError(f"a neighbour graph of degree {k}: must be even and ≥ 2")
    prefix = f"edgefl-secagg|graph|{context}|".encode() + seed
    ring = sorted(ids, key=lambda d: (hashlib.sha256(prefix + d.encode()).digest(), d))
    return {
        d: {ring[(i + j) % n] for j in range(-k // 2, k // 2 + 1) if j} for i, d in enumerate(ring)
    }


def check_graph(graph: Mapping[str, set[str]], ids: Sequence[str], k: int) -> None:
    """SecAggError unless ``graph`` is a k-regular undirected graph over exactly ``ids``, with
    2 ≤ k ≤ n - 1, and no device its own neighbour."""
    n = len(ids)
    if not (k == n - 1 or (2 <= k < n - 1 and k % 2 == 0)):
        raise SecAggError(f"{k} neighbours a device in a round of {n}: out of bounds")
    if set(graph) != set(ids):
        missing = sorted(set(ids) - set(graph)) or sorted(set(graph) - set(ids))
        raise SecAggError(f"the neighbour graph and the roster differ (at {missing[0]!r})")
    for d, near in graph.items():
        if d in near:
            raise SecAggError(f"the neighbour graph makes {d!r} its own neighbour")
        if len(near) != k:
            raise SecAggError(
                f"{d!r} has {len(near)} neighbours, not {k}: the graph is not regular"
            )
        for v in near:
            if v not in graph or d not in graph[v]:
                raise SecAggError(f"{d!r} lists {v!r} as a neighbour, but not the other way round")
