"""Secure aggregation for weight averaging: the protocol, one device and the server, one round.

The protocol is SecAgg+ (Bell et al., CCS 2020): SecAgg (Bonawitz et al., CCS 2017) on a
k-regular **neighbour graph** (:mod:`edgefl.privacy.secagg_graph`; k = n - 1 is the full graph):

0. **advertise keys** — each device makes two fresh X25519 key pairs (one for the channel, one for
   the pairwise masks) and a 256-bit self-mask seed, and sends both public keys and a SHA-256
   commitment to the seed. The server fixes the roster (U1), draws the graph's seed and sends
   each device the roster's ids, the seed, and its neighbours' keys.
1. **share keys** — each device rebuilds the graph from the seed and checks it, splits its seed
   and its mask private key into Shamir shares (threshold t of the k + 1 holders: its neighbours
   and itself, GF(2⁵²¹-1)), and seals each neighbour's pair of shares with ChaCha20-Poly1305
   under the key both agree on by X25519; the server relays them (it cannot read them).
2. **masked input** — each device that received its neighbours' shares (U2) trains, and sends
   its weighted update in fixed point plus its self mask plus, for each neighbour v that shared,
   ±PRG(agreed secret) (+ when its id sorts before v's). Pairwise masks cancel in the sum; the
   self mask does not.
3. **unmasking** — the server names to each device its neighbours whose masked input arrived
   (U3); each sends its shares of those neighbours' seeds and of its dropped neighbours' mask
   keys, never both kinds for one peer (a device asked for both refuses). With t shares of each
   the server removes the self masks and the dropped devices' pairwise masks: what is left is
   the sum.

Integrity: every reconstructed secret is checked against what its owner committed to in step 0
(the seed's hash, the private key's public key); a share that does not fit is its holder's lie
(another t shares are tried, and the liar is named); four coordinates that every device sets to
zero (canaries) and the range of the sum catch a device whose masked input does not match its
masks. Either way a round fails loudly rather than give a corrupted sum.

Fixed point: each coordinate of a device's update is clipped to [-clip, clip], multiplied by the
device's weight (its share of the round's total weight, ≤ 1) and rounded to a multiple of
``clip / 2²⁹`` in Z/2³²Z (2 bits of headroom): with the weights summing to at most 1 the sum never
wraps, and the average's error is at most n·clip/2³⁰ per coordinate (clip 8: 7.5e-9 per device).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from edgefl.errors import ConfigError
from edgefl.privacy.declare import number, split_options, text
from edgefl.privacy.secagg_crypto import (
    KEY_BYTES,
    RING_BITS,
    SHARE_BYTES,
    SecAggError,
    agree,
    commitment,
    derive,
    new_keypair,
    open_sealed,
    prg,
    private_bytes,
    seal,
    share_bytes,
    share_secret,
    share_value,
)
from edgefl.privacy.secagg_graph import (
    check_graph,
    degree_for,
    harary_graph,
    parse_neighbours,
    threshold_of,
)

#: Bits of headroom above the largest possible sum (a stray mask lands outside with prob. 3/4).
HEADROOM_BITS = 2
#: Coordinates every device sets to 0: a mask left in the sum shows there (miss: 2^-128).
CANARIES = 4
#: What a device advertises: channel public key ‖ mask public key ‖ seed commitment.
ADVERT_BYTES = 3 * KEY_BYTES
#: One sealed pair of shares: nonce ‖ ciphertext (seed share ‖ key share) ‖ tag.
SEALED_BYTES = 12 + 2 * SHARE_BYTES + 16

#: The method options that carry secure aggregation (``-o secagg=on``, the CLI's ``--secagg``).
OPTION_KEYS = {
    "secagg": "on",
    "secagg_threshold": "threshold",
    "secagg_clip": "clip",
    "secagg_neighbours": "neighbours",
}


@dataclass(frozen=True)
class SecAggSettings:
    """``neighbours``: each device's neighbours in the round's graph (``auto``, ``full`` or an
    even k; :mod:`edgefl.privacy.secagg_graph`). ``threshold``: the fraction of the k + 1 holders
    of a device's shares (its neighbours and itself) needed to remove a mask (t =
    ⌈threshold·(k + 1)⌉, at least 2): up to k + 1 - t of them may drop out after sharing, and the
    server with fewer than t of them learns nothing but the sum. ``clip``: the fixed-point range
    of one coordinate of a device's update."""

    on: bool = False
    threshold: float = 0.6
    clip: float = 8.0
    neighbours: str = "auto"

    def __post_init__(self):
        if not 0.5 <= self.threshold <= 1:
            raise ConfigError(f"secagg_threshold must be in [0.5, 1] (got {self.threshold})")
        if not (self.clip > 0 and math.isfinite(self.clip)):
            raise ConfigError(f"secagg_clip must be a finite number > 0 (got {self.clip})")
        object.__setattr__(self, "neighbours", parse_neighbours(self.neighbours))
        if self.neighbours != "auto" and not self.on:
            raise ConfigError("secagg_neighbours is an option of secure aggregation: add secagg=on")

    def neighbours_for(self, n: int) -> int:
        """Each device's number of neighbours k in a round of n devices (n - 1: full graph)."""
        return degree_for(self.neighbours, n, self.threshold)

    def threshold_for(self, n: int) -> int:
        """t in a round of n devices: of the k + 1 holders of each device's shares."""
        return threshold_of(self.neighbours_for(n), self.threshold)

    @property
    def scale(self) -> float:
        """Fixed-point units per unit of an update coordinate."""
        return 2.0 ** (RING_BITS - 1 - HEADROOM_BITS) / self.clip

    def as_options(self) -> dict[str, str]:
        if not self.on:
            return {}
        return {
            "secagg": "on",
            "secagg_threshold": repr(self.threshold),
            "secagg_clip": repr(self.clip),
            "secagg_neighbours": self.neighbours,
        }


def _secagg_value(key: str, name: str, value: object) -> object:
    if name == "on":
        if text(value) not in ("on", "off", "true", "false", "1", "0"):
            raise ConfigError(f"option secagg={value!r}: choose on or off")
        return text(value) in ("on", "true", "1")
    return text(value) if name == "neighbours" else number(key, value)


def split_secagg_options(raw: Mapping[str, object]) -> tuple[dict[str, object], SecAggSettings]:
    """(the other options, the secure-aggregation settings) from a method's raw options."""
    own, values = split_options(raw, OPTION_KEYS, _secagg_value)
    return own, SecAggSettings(**values)


# --- fixed point ---------------------------------------------------------------------------------


def encode(vector: np.ndarray, weight: float, settings: SecAggSettings) -> tuple[np.ndarray, int]:
    """A device's weighted update in Z/2³²Z (canaries appended), and how many coordinates the
    clip cut."""
    v = np.asarray(vector, np.float64)
    clipped = int(np.count_nonzero(np.abs(v) > settings.clip))
    q = np.rint(np.clip(v, -settings.clip, settings.clip) * (weight * settings.scale)).astype(
        np.int64
    )
    return np.concatenate([q, np.zeros(CANARIES, np.int64)]).astype(np.uint32), clipped


def decode(total: np.ndarray, devices: int, settings: SecAggSettings) -> np.ndarray:
    """The sum of the weighted updates from the unmasked sum in Z/2³²Z. SecAggError when a mask
    is left in it (a canary is not 0, or a coordinate is out of the range any sum can take)."""
    signed = np.asarray(total, np.uint32).view(np.int32).astype(np.int64)
    body, canaries = signed[:-CANARIES], signed[-CANARIES:]
    bound = 2 ** (RING_BITS - 1 - HEADROOM_BITS) + devices
    if np.any(canaries != 0) or np.any(np.abs(body) > bound):
        raise SecAggError(
            "the unmasked sum still carries a mask: a device's masked input does not match the "
            "masks it shared (or a share was wrong and went unnoticed); the round's sum is refused"
        )
    return body.astype(np.float64) / settings.scale


def pair_sign(me: str, peer: str) -> int:
    return 1 if me < peer else -1


# --- one device ----------------------------------------------------------------------------------


class DeviceRound:
    """One device's part in one round of the protocol (its secrets live only here)."""

    def __init__(self, device_id: str, context: str, settings: SecAggSettings):
        self.me, self.context, self.settings = device_id, context, settings
        self.channel_sk, channel_pk = new_keypair()
        self.mask_sk, mask_pk = new_keypair()
        self.seed = secrets.token_bytes(KEY_BYTES)
        self.advert = channel_pk + mask_pk + commitment(self.seed, context)
        self.roster: dict[str, bytes] = {}
        self.threshold = 0
        # peer → (its seed share, its key share) for me
        self.held: dict[str, tuple[int, int]] = {}
        self.neighbours: list[str] = []  # my neighbours in the round's graph
        self.peers: list[str] = []  # the neighbours whose shares I hold (my view of U2, less me)
        self.revealed: dict[str, str] = {}  # peer → "seed" or "key": what I told the server
        self.stage = "advertised"

    def share(
        self, ids: Sequence[str], adverts: Mapping[str, bytes], threshold: int, k: int, seed: bytes
    ) -> dict[str, bytes]:
        """Sealed shares of my seed and mask key for each of my neighbours: ``ids``, the roster
        (U1); ``k`` and ``seed``, the graph's degree and seed; ``adverts``, my neighbours' keys
        and mine, as the server sends them. Refuses a graph that is not the settings' or not
        well formed, and keys that are not my neighbours'."""
        self._expect("advertised", "share keys")
        n = len(ids)
        if len(set(ids)) != n or self.me not in ids:
            raise SecAggError("the roster repeats a device or leaves this one out")
        # the device computes k and t itself: a server that lowered either could rebuild a
        # secret from fewer shares (or fewer colluders) than the run's settings promise
        want_k, want_t = self.settings.neighbours_for(n), self.settings.threshold_for(n)
        if (k, threshold) != (want_k, want_t):
            raise SecAggError(
                f"a roster of {n} devices with {k} neighbours and threshold {threshold} (the "
                f"settings give {want_k} and {want_t}): refused"
            )
        graph = harary_graph(list(ids), k, bytes(seed), self.context)
        check_graph(graph, list(ids), k)
        near = graph[self.me]
        if set(adverts) != near | {self.me}:
            raise SecAggError(
                "the keys sent to this device are not those of its neighbours in the graph the "
                "announced seed gives: refused"
            )
        if adverts[self.me] != self.advert:
            raise SecAggError(f"the roster does not carry {self.me}'s own keys")
        if len({bytes(a[:KEY_BYTES]) for a in adverts.values()}) < len(adverts) or len(
            {bytes(a[KEY_BYTES : 2 * KEY_BYTES]) for a in adverts.values()}
        ) < len(adverts):
            raise SecAggError("two devices of the roster advertise the same key")
        self.roster, self.threshold = {d: bytes(v) for d, v in adverts.items()}, threshold
        self.neighbours = sorted(near)
        points = points_of(ids)
        xs = [points[d] for d in sorted(self.roster)]
        seeds = share_secret(self.seed, xs, threshold)
        keys = share_secret(private_bytes(self.mask_sk), xs, threshold)
        self.held[self.me] = (seeds[points[self.me]], keys[points[self.me]])
        out = {}
        for peer in self.neighbours:
            x = points[peer]
            key = derive(
                agree(self.channel_sk, self.roster[peer][:KEY_BYTES]), "channel", self.context
            )
            out[peer] = seal(
                key, self.context, self.me, peer, share_bytes(seeds[x]) + share_bytes(keys[x])
            )
        self.stage = "shared"
        return out

    def masked_input(
        self, sealed: Mapping[str, bytes], update: np.ndarray, weight: float
    ) -> tuple[np.ndarray, int]:
        """My weighted update, masked; ``sealed``: the shares each peer that shared (U2) sealed
        for me. Also returns the number of coordinates the fixed-point clip cut."""
        self._expect("shared", "masked input")
        unknown = sorted(set(sealed) - set(self.neighbours))
        if unknown:
            raise SecAggError(
                f"shares from {unknown[0]!r}, which is not a neighbour of this device"
            )
        if len(sealed) + 1 < self.threshold:
            raise SecAggError(
                f"only {len(sealed) + 1} of this device's neighbourhood shared keys; the "
                f"threshold is {self.threshold}"
            )
        if not 0 < weight <= 1:
            raise SecAggError(f"a weight of {weight} (must be in (0, 1])")
        for peer, box in sealed.items():
            key = derive(
                agree(self.channel_sk, self.roster[peer][:KEY_BYTES]), "channel", self.context
            )
            plain = open_sealed(key, self.context, peer, self.me, box)
            self.held[peer] = (share_value(plain[:SHARE_BYTES]), share_value(plain[SHARE_BYTES:]))
        self.peers = sorted(sealed)
        y, clipped = encode(update, weight, self.settings)
        y += prg(derive(self.seed, "self-mask", self.context), len(y))
        for peer in self.peers:
            mask = prg(pair_key(self.mask_sk, self.roster[peer], self.context), len(y))
            y = y + mask if pair_sign(self.me, peer) > 0 else y - mask
        self.stage = "masked"
        return y, clipped

    def unmask(self, survivors: Sequence[str]) -> tuple[list[bytes], list[bytes]]:
        """My shares of the seeds of ``survivors`` (my neighbours and I whose masked input
        arrived, in that order) and of the mask keys of the neighbours that shared and did not
        survive (in sorted order). Refuses a request that would reveal both kinds for a peer."""
        if self.stage not in ("masked", "unmasked"):
            raise SecAggError(
                f"an unmasking request before this device sent its masked input ({self.stage})"
            )
        alive = list(survivors)
        if len(set(alive)) != len(alive) or self.me not in alive:
            raise SecAggError("the survivors' list repeats a device or leaves this one out")
        outside = sorted(set(alive) - set(self.peers) - {self.me})
        if outside:
            raise SecAggError(
                f"{outside[0]!r} is named a survivor, but it sent this device no shares"
            )
        if len(alive) < self.threshold:
            raise SecAggError(
                f"{len(alive)} survivors in this device's neighbourhood; the threshold is "
                f"{self.threshold}"
            )
        dropped = sorted(set(self.peers) - set(alive))
        asked = {**dict.fromkeys(alive, "seed"), **dict.fromkeys(dropped, "key")}
        both = sorted(p for p, kind in asked.items() if self.revealed.get(p, kind) != kind)
        if both:
            raise SecAggError(
                f"refused: the server asks for both the seed and the mask key of {both[0]!r} "
                "(that would unmask its update)"
            )
        self.revealed.update(asked)
        self.stage = "unmasked"
        return [share_bytes(self.held[p][0]) for p in alive], [
            share_bytes(self.held[p][1]) for p in dropped
        ]

    def _expect(self, stage: str, what: str) -> None:
        if self.stage != stage:
            raise SecAggError(f"a {what} request out of order (this device is at {self.stage!r})")


def points_of(roster: Mapping[str, bytes]) -> dict[str, int]:
    """Each device's Shamir point: its position in the sorted roster, from 1."""
    return {d: i + 1 for i, d in enumerate(sorted(roster))}


def pair_key(sk, peer_advert: bytes, context: str) -> bytes:
    """The PRG key of a pair's mask: X25519 of one's mask key and the peer's, through HKDF."""
    return derive(agree(sk, bytes(peer_advert[KEY_BYTES : 2 * KEY_BYTES])), "pair-mask", context)
