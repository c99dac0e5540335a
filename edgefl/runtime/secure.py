"""One round of secure aggregation, driven by the round loop (:mod:`edgefl.privacy.secagg`).

Four exchanges with the round's devices, each a ``train`` request and its ``update`` reply
checked like any other (the server half states what each stage's replies carry): advertise keys →
share keys → masked input (the devices train here) → unmasking. A device that fails or does not
answer a stage is out of the round from then on; the round's traffic and failures are those of
all four stages. What the loop aggregates is one uplink: the average of the survivors' updates.

When the protocol cannot finish (fewer devices than the threshold remain, a share or a masked
input that does not fit what its sender committed to) the round fails loudly: every device of
it is recorded as failed with the reason, and nothing is aggregated.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from edgefl.privacy.secagg import ADVERT_BYTES, SEALED_BYTES
from edgefl.privacy.secagg_crypto import SecAggError
from edgefl.privacy.secagg_halves import (
    ADVERT,
    ADVERTS,
    CONTEXT,
    DEGREE,
    DEVICES,
    GRAPH_SEED,
    IDS,
    KEY_SHARES,
    MASKED,
    NEIGHBOURS,
    SEALED,
    SEED_SHARES,
    STAGE,
    SUM,
    THRESHOLD,
    WEIGHT,
    ids_array,
    rows,
    stack,
)
from edgefl.privacy.secagg_server import ServerRound
from edgefl.runtime.claims import bound_uplinks
from edgefl.wire import Payload

log = logging.getLogger(__name__)


class SecureRound:
    """The four exchanges of one round; :meth:`run` returns the loop's (Exchange, uplinks)."""

    def __init__(self, loop: Any, round: int, out: Any):
        self.loop, self.round = loop, round
        self.server = loop.server  # a SecAggServer (it may wrap central DP and the method)
        self.context = f"{loop.settings.run_id}|{round}"
        self.protocol = ServerRound(self.context, self.server.secagg)
        self.out = out  # the loop's Exchange: the round's traffic and failures, all stages
        self.seconds: dict[str, float] = {}

    def exchange(self, stage: str, payloads: Mapping[str, Payload], specs) -> Any:
        t0 = time.perf_counter()
        self.server.expect = specs
        try:
            ex = self.loop.exchange("train", self.round, payloads, expect="update", stage="train")
        finally:
            self.server.expect = None
        for d in payloads:
            self.out.bytes_down[d] = self.out.bytes_down.get(d, 0) + ex.bytes_down.get(d, 0)
            self.out.bytes_up[d] = self.out.bytes_up.get(d, 0) + ex.bytes_up.get(d, 0)
            self.out.seconds[d] = self.out.seconds.get(d, 0.0) + ex.seconds.get(d, 0.0)
            if d in ex.rejected:
                self.out.rejected[d] = self.out.rejected.get(d, 0) + ex.rejected[d]
        for d, reason in ex.failed.items():
            self.out.failed[d] = f"secagg {stage}: {reason}"
        self.seconds[stage] = time.perf_counter() - t0
        return ex

    def meta(self, stage: str, **extra: Any) -> dict[str, Any]:
        return {STAGE: stage, CONTEXT: self.context, **extra}

    def run(self, selected: list[str]) -> tuple[Any, dict[str, Payload]]:
        try:
            return self._run(selected)
        except SecAggError as e:
            log.error("round %d: secure aggregation failed: %s", self.round + 1, e)
            for d in selected:
                self.out.failed.setdefault(d, f"secagg: {e}")
            self.out.replies.clear()
            self.server.report = {**self._report(), "error": str(e)}
            return self.out, {}

    def _run(self, selected: list[str]) -> tuple[Any, dict[str, Payload]]:
        server, p = self.server, self.protocol
        # 0. advertise keys
        ex = self.exchange(
            "keys",
            {d: Payload({}, self.meta("keys")) for d in selected},
            lambda d: server.stage_specs("keys"),
        )
        adverts = {d: bytes(r.payload.arrays[ADVERT]) for d, r in ex.replies.items()}
        weights = self.weights(ex)
        t = p.set_roster(adverts)
        ids = list(p.roster)
        # 1. share keys: the roster, the graph's seed and the device's neighbours' keys; each
        # device seals shares for its neighbours, and the server only relays them
        common = {IDS: ids_array(ids), GRAPH_SEED: np.frombuffer(p.seed, np.uint8).copy()}
        meta = self.meta("shares", **{THRESHOLD: t, DEGREE: p.k})
        payloads = {}
        for d in ids:
            hood = p.neighbourhood(d)
            arrays = {
                **common,
                NEIGHBOURS: ids_array(list(hood)),
                ADVERTS: stack(list(hood.values()), ADVERT_BYTES),
            }
            payloads[d] = Payload(arrays, meta)
        ex = self.exchange(
            "shares", payloads, lambda d: server.stage_specs("shares", len(p.graph[d]))
        )
        sealed = {}
        for s, r in ex.replies.items():
            boxes = rows(r.payload.arrays[SEALED])
            sealed[s] = dict(zip(sorted(p.graph[s]), boxes, strict=True))
        inbox = p.relay(sealed)
        # 2. masked input: the model, the shares sealed for the device, its weight; it trains
        payloads = {}
        for d in p.shared:
            down = server.downlink(self.round, d)
            senders = sorted(inbox[d])
            arrays = {
                **down.arrays,
                IDS: ids_array(senders),
                SEALED: stack([inbox[d][s] for s in senders], SEALED_BYTES),
            }
            payloads[d] = Payload(
                arrays, {**down.meta, **self.meta("mask", **{WEIGHT: weights[d]})}
            )
        masked_ex = self.exchange("mask", payloads, lambda d: server.stage_specs("mask"))
        masked = {d: r.payload.arrays[MASKED] for d, r in masked_ex.replies.items()}
        clear = {
            d: {k: v for k, v in r.payload.arrays.items() if k != MASKED}
            for d, r in masked_ex.replies.items()
        }
        survivors = p.add_masked(masked)
        # 3. unmasking: each survivor's shares of its surviving neighbours' seeds (and its own)
        # and of its dropped neighbours' keys
        ex = self.exchange(
            "unmask",
            {
                d: Payload({IDS: ids_array(p.alive_for(d))}, self.meta("unmask"))
                for d in survivors
            },
            lambda d: server.stage_specs("unmask", len(p.alive_for(d)), len(p.dropped_for(d))),
        )
        shares = {
            h: (rows(r.payload.arrays[SEED_SHARES]), rows(r.payload.arrays[KEY_SHARES]))
            for h, r in ex.replies.items()
        }
        t0 = time.perf_counter()
        total = p.unmask(shares)
        self.seconds["unmask_server"] = time.perf_counter() - t0
        if p.liars:
            log.warning(
                "round %d: secure aggregation: shares that do not fit their owner's commitment "
                "came from %s",
                self.round + 1,
                ", ".join(sorted(p.liars)),
            )
        weight = sum(weights[d] for d in survivors)
        average = server.average(total, weight, clear, weights)
        self.out.replies = {d: masked_ex.replies[d] for d in survivors}
        server.report = self._report()
        return self.out, {SUM: Payload(average, {"num_samples": 1, DEVICES: len(survivors)})}

    def weights(self, ex: Any) -> dict[str, float]:
        """Each device's share of the round's weight: its declared sample count, bounded as every
        claim is (runtime/claims.py), over the total; 1/n under central DP (equal weights)."""
        if self.server.central_dp:
            return {d: 1.0 / len(ex.replies) for d in ex.replies}
        claims = {
            d: Payload({}, {"num_samples": r.payload.meta["num_samples"]})
            for d, r in ex.replies.items()
        }
        bounded, _ = bound_uplinks(
            self.round, claims, self.loop.ctx.fleet, self.loop.settings.weight_ratio
        )
        counts = {d: float(q.meta["num_samples"]) for d, q in bounded.items()}
        total = sum(counts.values())
        return {d: c / total for d, c in counts.items()} if total > 0 else {}

    def _report(self) -> dict[str, Any]:
        p = self.protocol
        return {
            "graph": "full" if p.full or not p.roster else "k-regular",
            "neighbours": p.k,
            "threshold": p.threshold,
            "advertised": len(p.roster),
            "shared": len(p.shared),
            "survivors": len(p.survivors),
            "dropped": p.dropped if p.survivors else [],
            "liars": dict(p.liars),
            "stage_seconds": dict(self.seconds),
        }


def secure_round(
    loop: Any, round: int, selected: list[str], out: Any
) -> tuple[Any, dict[str, Payload]]:
    """The round's exchanges (recorded in ``out``, an empty Exchange) and its one uplink (none
    when the round failed)."""
    return SecureRound(loop, round, out).run(selected)
