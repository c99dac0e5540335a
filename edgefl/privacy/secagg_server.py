"""Secure aggregation's server, one round (:mod:`edgefl.privacy.secagg` has the protocol): it
fixes the round's roster and neighbour graph, relays the sealed shares, sums the masked inputs and
removes the masks with the shares the survivors send."""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence

import numpy as np

from edgefl.privacy.secagg import (
    SecAggSettings,
    decode,
    pair_key,
    pair_sign,
    points_of,
)
from edgefl.privacy.secagg_crypto import (
    KEY_BYTES,
    SecAggError,
    commitment,
    derive,
    prg,
    public_of,
    recover,
    share_value,
)
from edgefl.privacy.secagg_graph import SEED_BYTES, check_graph, harary_graph


class ServerRound:
    """The server's part in one round: fixes the graph, relays, sums, and unmasks (it never
    holds a device's secret while that device's input is in the sum)."""

    def __init__(self, context: str, settings: SecAggSettings):
        self.context, self.settings = context, settings
        self.roster: dict[str, bytes] = {}
        self.threshold = self.k = 0
        self.seed = b""
        self.graph: dict[str, set[str]] = {}
        self.shared: list[str] = []
        self.total: np.ndarray | None = None
        self.survivors: list[str] = []
        self.liars: dict[str, str] = {}  # holder → whose secret its share did not fit

    def set_roster(self, adverts: Mapping[str, bytes]) -> int:
        """U1: the devices that advertised keys; draws the graph's seed; returns the threshold."""
        self.roster = {d: bytes(a) for d, a in sorted(adverts.items())}
        if len(self.roster) < 2:
            raise SecAggError(
                f"{len(self.roster)} devices advertised keys; secure aggregation needs 2 or more"
            )
        ids = list(self.roster)
        self.k = self.settings.neighbours_for(len(ids))
        self.threshold = self.settings.threshold_for(len(ids))
        self.seed = secrets.token_bytes(SEED_BYTES)  # drawn after the keys are fixed
        self.graph = harary_graph(ids, self.k, self.seed, self.context)
        check_graph(self.graph, ids, self.k)
        return self.threshold

    @property
    def full(self) -> bool:
        return self.k == len(self.roster) - 1

    def neighbourhood(self, device: str) -> dict[str, bytes]:
        """The keys a device is sent: its neighbours' and its own, by id (sorted)."""
        return {d: self.roster[d] for d in sorted(self.graph[device] | {device})}

    def relay(self, sealed: Mapping[str, Mapping[str, bytes]]) -> dict[str, dict[str, bytes]]:
        """U2 and what each of its devices is to receive: recipient → {sender: sealed shares},
        from the senders' {neighbour: sealed shares}."""
        self.shared = sorted(sealed)
        if len(self.shared) < self.threshold:
            raise SecAggError(
                f"{len(self.shared)} devices shared keys; the threshold is {self.threshold}"
            )
        for s in self.shared:
            if set(sealed[s]) != self.graph[s]:
                raise SecAggError(f"{s} sealed shares for other devices than its neighbours")
        return {
            r: {s: sealed[s][r] for s in sorted(self.graph[r]) if s in sealed}
            for r in self.shared
        }

    def add_masked(self, masked: Mapping[str, np.ndarray]) -> list[str]:
        """Sum the masked inputs (U3); returns the survivors."""
        self.survivors = sorted(masked)
        if len(self.survivors) < self.threshold:
            raise SecAggError(
                f"{len(self.survivors)} masked inputs arrived; the threshold is {self.threshold}"
            )
        total = None
        for d in self.survivors:
            y = np.asarray(masked[d]).view(np.uint32)
            total = y.copy() if total is None else total + y
        self.total = total
        return self.survivors

    @property
    def dropped(self) -> list[str]:
        return sorted(set(self.shared) - set(self.survivors))

    def alive_for(self, device: str) -> list[str]:
        """The survivors named to ``device`` at unmasking: its neighbours and itself."""
        return sorted((self.graph[device] | {device}) & set(self.survivors))

    def dropped_for(self, device: str) -> list[str]:
        """Its neighbours that shared keys and sent no masked input."""
        return sorted(self.graph[device] & set(self.dropped))

    def unmask(self, shares: Mapping[str, tuple[Sequence[bytes], Sequence[bytes]]]) -> np.ndarray:
        """The sum of the survivors' weighted updates, from the survivors' shares (holder →
        (seed shares in :meth:`alive_for`'s order, key shares in :meth:`dropped_for`'s))."""
        if len(shares) < self.threshold:
            raise SecAggError(
                f"{len(shares)} devices sent their shares; the threshold is {self.threshold}"
            )
        points, cache = points_of(self.roster), {}
        seed_at = {h: {v: i for i, v in enumerate(self.alive_for(h))} for h in shares}
        key_at = {h: {v: i for i, v in enumerate(self.dropped_for(h))} for h in shares}
        total = self.total.copy()
        for v in self.survivors:
            owner = self.roster[v][2 * KEY_BYTES :]
            seed = self._recover(
                v,
                {
                    points[h]: share_value(s[0][seed_at[h][v]])
                    for h, s in shares.items()
                    if v in seed_at[h]
                },
                lambda secret, c=owner: commitment(secret, self.context) == c,
                cache,
            )
            total -= prg(derive(seed, "self-mask", self.context), len(total))
        for v in self.dropped:
            public = self.roster[v][KEY_BYTES : 2 * KEY_BYTES]
            sk = self._recover(
                v,
                {
                    points[h]: share_value(s[1][key_at[h][v]])
                    for h, s in shares.items()
                    if v in key_at[h]
                },
                lambda secret, p=public: public_of(secret) == p,
                cache,
            )
            for u in sorted(self.graph[v] & set(self.survivors)):  # u added ±PRG(k_uv)
                mask = prg(pair_key(sk, self.roster[u], self.context), len(total))
                total = total - mask if pair_sign(u, v) > 0 else total + mask
        return decode(total, len(self.survivors), self.settings)

    def _recover(self, owner: str, shares: dict[int, int], valid, cache: dict) -> bytes:
        try:
            secret, bad = recover(shares, self.threshold, valid, weights_cache=cache)
        except SecAggError as e:
            raise SecAggError(f"cannot remove {owner}'s mask: {e}") from None
        by_point = {x: d for d, x in points_of(self.roster).items()}
        for x in bad:
            self.liars[by_point[x]] = owner
        return secret
