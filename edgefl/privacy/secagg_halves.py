"""Secure aggregation as an option of a weight method: the wrappers around its device half and
its server half that the run assembly builds when a run asks (``-o secagg=on``, ``--secagg``).

Every stage of the protocol (:mod:`edgefl.privacy.secagg`) is one ``train`` request and its
``update`` reply, in the one message shape: the request's metadata names the stage
(``secagg``) and the round's context; the arrays are bytes (uint8: device ids, public keys,
sealed shares, shares) or the masked vector (int32, the ring's elements as two's complement), each
declared with its dtype and shape and checked on arrival like any uplink. The round loop drives
the stages (:mod:`edgefl.runtime.secure`).

The device's update is its trained weights minus those it received (float tensors, one vector
in name order); integer tensors (BatchNorm's step counters: a function of the public sample
count) travel in the clear. Its weight is the server's: the share of the round's total declared
sample count (bounded as every claim is), or 1/n with central DP. Only ``num_samples`` (and
``dp_epsilon``) travel beside the masked vector: the training loss stays on the device.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgefl.errors import ConfigError
from edgefl.privacy.secagg import (
    ADVERT_BYTES,
    CANARIES,
    SEALED_BYTES,
    DeviceRound,
    SecAggSettings,
)
from edgefl.privacy.secagg_crypto import SHARE_BYTES, SecAggError
from edgefl.privacy.secagg_graph import SEED_BYTES
from edgefl.wire import ArraySpec, Payload, array_spec, in_group

log = logging.getLogger(__name__)

#: Request metadata: the stage (keys, shares, mask, unmask), the round's context, and more.
STAGE, CONTEXT, THRESHOLD, WEIGHT = "secagg", "secagg_context", "secagg_threshold", "secagg_weight"
#: The graph's degree k (request metadata) and the arrays that announce the graph: its seed, and
#: the device's neighbourhood (its neighbours and itself, sorted: the rows of ``ADVERTS``).
DEGREE, GRAPH_SEED, NEIGHBOURS = "secagg_degree", "secagg/graph_seed", "secagg/neighbours"
STAGES = ("keys", "shares", "mask", "unmask")
#: Arrays (all under secagg/): ids ([n, 64] ASCII, zero-padded), adverts, sealed shares, …
IDS, ADVERTS, SEALED = "secagg/ids", "secagg/adverts", "secagg/sealed"
ADVERT, MASKED, SEED_SHARES, KEY_SHARES = (
    "secagg/advert",
    "secagg/masked",
    "secagg/seed_shares",
    "secagg/key_shares",
)
ID_BYTES = 64
#: The round's one uplink after unmasking: the average, and how many devices it averages.
SUM, DEVICES = "secagg", "secagg_devices"
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
#: The methods whose devices send one global model's weights and nothing else.
SUPPORTED = ("fedavg", "fedprox")


def ids_array(ids: Sequence[str]) -> np.ndarray:
    out = np.zeros((len(ids), ID_BYTES), np.uint8)
    for i, d in enumerate(ids):
        raw = d.encode("ascii")
        out[i, : len(raw)] = np.frombuffer(raw, np.uint8)
    return out


def ids_of(array: np.ndarray) -> list[str]:
    """Device ids from :func:`ids_array`'s encoding; SecAggError on anything else."""
    out = []
    for row in np.asarray(array, np.uint8):
        text = bytes(row).rstrip(b"\0")
        name = text.decode("ascii", "replace")
        if b"\0" in text or not _ID.match(name):
            raise SecAggError(f"not a device id: {name[:64]!r}")
        out.append(name)
    if len(set(out)) != len(out):
        raise SecAggError("a device id is listed twice")
    return out


def rows(array: np.ndarray) -> list[bytes]:
    return [bytes(r) for r in np.asarray(array, np.uint8)]


def stack(items: Sequence[bytes], width: int) -> np.ndarray:
    if not items:
        return np.zeros((0, width), np.uint8)
    return np.stack([np.frombuffer(b, np.uint8) for b in items])


def float_layout(arrays: Mapping[str, np.ndarray]) -> list[tuple[str, tuple[int, ...]]]:
    """The float tensors of a model, in name order, with their shapes: the masked vector's
    layout."""
    return [
        (k, tuple(np.shape(v)))
        for k, v in sorted(arrays.items())
        if np.asarray(v).dtype.kind == "f"
    ]


def check_secagg(method: str, release: Any, defences: Any, privacy: Any) -> None:
    """ConfigError when secure aggregation cannot protect this method's uplink as configured;
    a warning where an option changes meaning under it (robust defences the server cannot apply).
    ``defences``: the method's combining rule and bound (``aggregator``, ``clip_norm``; the
    runtime's ``Method.defences``)."""
    if (
        method not in SUPPORTED
        or release is None
        or release.stats is not None
        or release.whole != ("w/",)
    ):
        raise ConfigError(
            f"secure aggregation sums one global model's weights: {method} sends something else "
            f"(supported: {', '.join(SUPPORTED)})"
        )
    aggregator = defences.aggregator
    if aggregator != "mean":
        raise ConfigError(
            f"aggregator={aggregator} cannot apply with secure aggregation: the server never "
            "sees a single device's update, only the sum (use aggregator=mean)"
        )
    if privacy.adaptive_quantile:
        raise ConfigError(
            "dp_adaptive_quantile cannot apply with secure aggregation: it counts the updates "
            "whose norm is under the clip, and the server never sees one"
        )
    if defences.clip_norm > 0:
        _say_once(
            f"secure aggregation: clip_norm={defences.clip_norm:g} is applied by each device to "
            "its own update before masking (the server cannot see updates): it bounds honest "
            "devices only"
        )
    if privacy.mode == "central":
        _say_once(
            "secure aggregation with dp=central: each device clips its own update to "
            f"dp_clip={privacy.clip:g} before masking (the server cannot), weights are equal, and "
            "the server adds the noise to the unmasked average"
        )


_said: set[str] = set()


def _say_once(message: str) -> None:
    """A warning about a combination of options, once per process (the options are resolved
    more than once in a run)."""
    if message not in _said:
        _said.add(message)
        log.warning("%s", message)


def device_clip(privacy: Any, defences: Any) -> float:
    """The L2 bound a device applies to its own update before masking (0: none): central DP's
    clip, else the method's clip_norm (the server cannot clip what it cannot see)."""
    if privacy.mode == "central":
        return float(privacy.clip)
    return float(defences.clip_norm)


class SecAggDevice:
    """A weight method's device half whose update leaves the device only masked."""

    def __init__(self, inner: Any, settings: SecAggSettings, l2_clip: float = 0.0):
        self.inner, self.settings, self.l2_clip = inner, settings, l2_clip
        self.state: DeviceRound | None = None
        self.request: tuple[int, str, Payload] | None = None
        self.received: dict[str, np.ndarray] = {}

    def __getattr__(self, name: str) -> Any:  # model, ctx, sends_final_model, … are the method's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def expected_downlink(self) -> dict[str, ArraySpec] | None:
        base = self.inner.expected_downlink()
        if base is None:
            return None
        return {
            **in_group(base, "model"),
            IDS: array_spec(np.uint8, (None, ID_BYTES), "ids"),
            # the key-sharing request's: a device's neighbours' keys, their ids and the graph
            ADVERTS: array_spec(np.uint8, (None, ADVERT_BYTES), "graph"),
            NEIGHBOURS: array_spec(np.uint8, (None, ID_BYTES), "graph"),
            GRAPH_SEED: array_spec(np.uint8, (SEED_BYTES,), "graph"),
            SEALED: array_spec(np.uint8, (None, SEALED_BYTES), "sealed"),
        }

    def receive(self, round: int, payload: Payload) -> None:
        stage = payload.meta.get(STAGE)
        if stage is None:  # an evaluation's or the finish's downlink: the method's
            self.inner.receive(round, payload)
            return
        if stage not in STAGES:
            raise SecAggError(f"unknown secure aggregation stage {stage!r}")
        self.request = (round, str(stage), payload)
        if stage == "mask":
            weights = {k: v for k, v in payload.arrays.items() if not k.startswith("secagg/")}
            if not weights:
                raise SecAggError("the masked-input request carries no model to train")
            meta = {k: v for k, v in payload.meta.items() if not k.startswith("secagg")}
            self.inner.receive(round, Payload(weights, meta))
            self.received = {
                k: np.array(v, np.float64)
                for k, v in weights.items()
                if np.asarray(v).dtype.kind == "f"
            }

    def fit(self, round: int) -> Payload:
        if self.request is None or self.request[0] != round:
            raise SecAggError(
                "a training request without a secure aggregation stage (this run uses secagg)"
            )
        _, stage, p = self.request
        self.request = None
        context = str(p.meta.get(CONTEXT, ""))
        n = len(self.inner.ctx.train_data)
        if stage == "keys":
            self.state = DeviceRound(self.inner.ctx.device_id, context, self.settings)
            return Payload(
                {ADVERT: np.frombuffer(self.state.advert, np.uint8).copy()}, {"num_samples": n}
            )
        state = self.state
        if state is None or state.context != context:
            raise SecAggError(f"a {stage} request for another round than this device's keys")
        if stage == "shares":
            return self._share(state, p, n)
        if stage == "mask":
            return self._masked(round, state, p, n)
        seeds, keys = state.unmask(ids_of(p.arrays[IDS]))
        return Payload(
            {SEED_SHARES: stack(seeds, SHARE_BYTES), KEY_SHARES: stack(keys, SHARE_BYTES)},
            {"num_samples": n},
        )

    def _share(self, state: DeviceRound, p: Payload, n: int) -> Payload:
        if NEIGHBOURS not in p.arrays or GRAPH_SEED not in p.arrays:
            raise SecAggError("the key-sharing request announces no neighbour graph")
        hood = ids_of(p.arrays[NEIGHBOURS])
        adverts = rows(p.arrays[ADVERTS])
        if len(adverts) != len(hood):
            raise SecAggError("the neighbourhood's ids and keys differ in number")
        degree = p.meta.get(DEGREE)
        if isinstance(degree, bool) or not isinstance(degree, int):
            raise SecAggError("the key-sharing request names no graph degree")
        sealed = state.share(
            ids_of(p.arrays[IDS]),
            dict(zip(hood, adverts, strict=True)),
            int(p.meta.get(THRESHOLD, 0)),
            degree,
            bytes(np.asarray(p.arrays[GRAPH_SEED], np.uint8)),
        )
        return Payload(
            {SEALED: stack([sealed[d] for d in state.neighbours], SEALED_BYTES)},
            {"num_samples": n},
        )

    def _masked(self, round: int, state: DeviceRound, p: Payload, n: int) -> Payload:
        senders = ids_of(p.arrays[IDS])
        sealed = rows(p.arrays[SEALED])
        if len(sealed) != len(senders):
            raise SecAggError("the relayed shares and their senders differ in number")
        weight = p.meta.get(WEIGHT)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            raise SecAggError("the masked-input request names no weight")
        up = self.inner.fit(round)
        layout = float_layout(up.arrays)
        if [k for k, _ in layout] != sorted(self.received):
            raise SecAggError("the trained model's float tensors differ from the model received")
        delta = np.concatenate(
            [(np.asarray(up.arrays[k], np.float64) - self.received[k]).ravel() for k, _ in layout]
        )
        if (
            self.l2_clip > 0
        ):  # central DP's clip (or clip_norm): the server cannot clip a masked update
            norm = float(np.linalg.norm(delta))
            if norm > self.l2_clip:
                delta *= self.l2_clip / norm
        masked, clipped = state.masked_input(
            dict(zip(senders, sealed, strict=True)), delta, float(weight)
        )
        if clipped:
            log.warning(
                "device %s: %d coordinates of its update exceed secagg_clip=%g and were clipped",
                state.me,
                clipped,
                self.settings.clip,
            )
        arrays = {
            k: np.asarray(v) for k, v in up.arrays.items() if np.asarray(v).dtype.kind in "iu"
        }
        arrays[MASKED] = masked.view(np.int32)
        meta = {"num_samples": n, **{k: v for k, v in up.meta.items() if k == "dp_epsilon"}}
        return Payload(arrays, meta)


class SecAggServer:
    """A weight method's server half that sums masked updates: it states what each stage's
    replies must carry, and turns the unmasked sum into the method's one average."""

    def __init__(self, inner: Any, settings: SecAggSettings, *, central_dp: bool = False):
        self.inner, self.settings, self.central_dp = inner, settings, central_dp
        self.secagg = settings
        self.expect: Any = None  # device → the arrays the current stage's reply must carry
        self.report: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def expected_uplink(self, device_id: str) -> Mapping[str, ArraySpec] | None:
        if self.expect is None:
            return self.inner.expected_uplink(device_id)
        return self.expect(device_id)

    def model(self) -> dict[str, np.ndarray]:
        """The global model's arrays (the state that the average of updates is added to)."""
        return {k: v for k, v in self.inner.state_dict().items() if k.startswith("w/")}

    def stage_specs(self, stage: str, n: int = 0, dropped: int = 0) -> dict[str, ArraySpec]:
        """What a reply carries at ``stage``: ``n`` is the device's number of neighbours (shares)
        or of survivors named to it (unmask), ``dropped`` its dropped neighbours (unmask)."""
        u8 = np.uint8
        if stage == "keys":
            return {ADVERT: array_spec(u8, (ADVERT_BYTES,))}
        if stage == "shares":
            return {SEALED: array_spec(u8, (n, SEALED_BYTES))}
        if stage == "unmask":
            return {
                SEED_SHARES: array_spec(u8, (n, SHARE_BYTES)),
                KEY_SHARES: array_spec(u8, (dropped, SHARE_BYTES)),
            }
        model = self.model()
        length = sum(int(np.prod(s)) for _, s in float_layout(model)) + CANARIES
        ints = {
            k: array_spec(np.asarray(v).dtype, np.shape(v))
            for k, v in model.items()
            if np.asarray(v).dtype.kind in "iu"
        }
        return {MASKED: array_spec(np.int32, (length,)), **ints}

    def average(
        self,
        total: np.ndarray,
        weight: float,
        clear: Mapping[str, Mapping[str, np.ndarray]],
        weights: Mapping[str, float],
    ) -> dict[str, np.ndarray]:
        """The global model plus the weighted average of the updates (the unmasked ``total``
        divided by the survivors' ``weight``); integer tensors averaged in the clear."""
        model = self.model()
        out, at = {}, 0
        for k, shape in float_layout(model):
            size = int(np.prod(shape))
            out[k] = (
                np.asarray(model[k], np.float64) + total[at : at + size].reshape(shape) / weight
            ).astype(model[k].dtype)
            at += size
        for k, v in model.items():
            if k not in out:
                mean = (
                    sum(weights[d] * np.asarray(c[k], np.float64) for d, c in clear.items())
                    / weight
                )
                out[k] = np.rint(mean).astype(np.asarray(v).dtype)
        return out

    def aggregate(self, round: int, uplinks: Mapping[str, Payload]) -> dict[str, float]:
        """The round's one uplink is the average (:data:`SUM`): handed to the method, or to
        central DP, which noises it for the number of devices in it."""
        if not uplinks:
            return self.inner.aggregate(round, uplinks)
        if set(uplinks) != {SUM}:
            raise SecAggError("a secure-aggregation server is given single devices' updates")
        if self.central_dp:
            return self.inner.central_aggregate(
                round, uplinks, devices=int(uplinks[SUM].meta[DEVICES])
            )
        return self.inner.aggregate(round, uplinks)

    def round_report(self) -> dict[str, Any]:
        return {**self.inner.round_report(), "secagg": dict(self.report)}
