"""Asynchronous buffered aggregation (FedBuff: Nguyen et al., "Federated Learning with Buffered
Asynchronous Aggregation", AISTATS 2022) as a mode of the one round loop (``--aggregation async
--buffer K``; in memory).

Every device of the fleet trains all the time. A device that is free pulls the newest model and
trains; its update arrives when its local work is done; the server aggregates every ``K`` arrivals
(one "round" of the loop: the method's own ``aggregate``, server optimizer included), and the
device whose update filled the buffer pulls the model that aggregation made. A device that
arrived earlier in the buffer pulls the model as it stood at its arrival and trains again (a
second update of it arriving before the buffer fills waits for the next buffer: one update per
device per aggregation). Updates still in flight when the run ends are not used.

Time is simulated, so a run is reproducible for a seed: a device's update arrives after the
samples it trains in a round (its shard × epochs, or steps × batch), one sample per unit of time;
on a fleet with declared conditions (a fleet file: :mod:`edgefl.runtime.clock`) in simulated
seconds instead: its link and compute time, and a device offline when it would pull the model
pulls it when it is back, one that goes offline in flight loses its update (``failed``) and
pulls the newest model when it is back. In memory a device trains the moment it is sent the
model, on that model, so what it sends is exactly what it would have sent at its arrival.

Staleness: an update trained on the model of aggregation ``v`` and aggregated at ``r`` has
staleness τ = r − v and weight s(τ) = 1/√(1+τ) (FedBuff's polynomial weighting). For the
arrays an uplink shares (by name, dtype and shape) with the downlink it answered — the weights
of a method whose devices send their model back — the update is rebased onto the current model:
``current + s(τ)·(sent back − received)``, so the method's average becomes
``current + Σ pᵢ·s(τᵢ)·Δᵢ``. Arrays a method declares to be changes of the model
(``MethodNeeds.uplink_deltas``: HeteroFL's and HierarchyFL's sub-model deltas, which its server
adds to the current model) are scaled by s(τ). Other arrays (FedDW's soft-label sums) pass
unchanged. Which methods can run this way is their declaration (``MethodNeeds.asynchronous``).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from edgefl.runtime.clock import update_bytes
from edgefl.wire import Envelope, Payload

if TYPE_CHECKING:
    from edgefl.algorithms.base import ServerContext
    from edgefl.runtime.clock import FleetClock

# the round loop (edgefl.runtime.loop.RoundLoop) and its Exchange are passed in, not imported: the
# loop imports this module
RoundLoop = Exchange = Any


def staleness_weight(staleness: int) -> float:
    """FedBuff's s(τ) = 1/√(1+τ)."""
    return 1.0 / math.sqrt(1.0 + staleness)


def rebase(update: Payload, received: Payload, current: Payload, staleness: int,
           deltas: tuple[str, ...] = ()) -> Payload:
    """``update`` (the device's reply to ``received``) moved onto ``current``, its change scaled by
    s(staleness), for every float array the three share by name and shape; a float array whose
    name starts with one of ``deltas`` (a change of the model) scaled by s; the rest unchanged."""
    if staleness == 0:
        return update
    s = staleness_weight(staleness)
    arrays = dict(update.arrays)
    for k, v in update.arrays.items():
        old, cur = received.arrays.get(k), current.arrays.get(k)
        v = np.asarray(v)
        if v.dtype.kind == "f" and k.startswith(deltas) and deltas:
            arrays[k] = (s * v.astype(np.float64)).astype(v.dtype)
            continue
        if (
            old is None
            or cur is None
            or v.dtype.kind != "f"
            or np.shape(old) != v.shape
            or np.shape(cur) != v.shape
        ):
            continue
        arrays[k] = (
            np.asarray(cur, np.float64) + s * (v.astype(np.float64) - np.asarray(old, np.float64))
        ).astype(v.dtype)
    return Payload(arrays, dict(update.meta))


def local_work(ctx: ServerContext, device_id: str) -> float:
    """Samples a device trains in a round: its (declared) shard × epochs, or steps × batch."""
    return float(ctx.settings.visits(max(ctx.fleet[device_id].num_samples, 1)))


@dataclass(order=True)
class _Flight:
    arrival: float
    seq: int
    device: str = field(compare=False)
    version: int = field(compare=False)  # the aggregation whose model it trains on
    received: Payload | None = field(compare=False)
    reply: Envelope | None = field(compare=False)
    bytes_up: int = field(compare=False)
    seconds: float = field(compare=False)
    # "update" arrives; "lost": its device went offline in flight; "wake": its device is back
    kind: str = field(default="update", compare=False)


class BufferedRounds:
    """The in-flight updates and the simulated clock of an asynchronous run."""

    def __init__(self, buffer: int, fleet: FleetClock | None = None):
        if buffer < 1:
            raise ValueError(f"the buffer must hold at least one update (got {buffer})")
        self.buffer = buffer
        self.fleet = fleet  # the fleet's conditions: the clock in simulated seconds
        self.clock = 0.0
        self._flights: list[_Flight] = []  # a heap by arrival time
        self._seq = 0

    def flying(self) -> set[str]:
        return {f.device for f in self._flights}

    def _push(self, at: float, device: str, version: int, kind: str,
              received: Payload | None = None,
              reply: Envelope | None = None, bytes_up: int = 0, seconds: float = 0.0) -> None:
        self._seq += 1
        flight = _Flight(at, self._seq, device, version, received, reply, bytes_up, seconds, kind)
        heapq.heappush(self._flights, flight)

    def _dispatch(self, loop: RoundLoop, round: int, devices: list[str], out: Exchange) -> None:
        """Send ``devices`` the current model; each reply is in flight until its arrival (a
        device offline now on the fleet's clock is sent it when it is back)."""
        if self.fleet is not None:
            for d in [d for d in devices if not self.fleet.online(d, self.clock)]:
                self._push(self.fleet.next_online(d, self.clock), d, round, "wake")
            devices = [d for d in devices if self.fleet.online(d, self.clock)]
        if not devices:
            return
        payloads = {d: loop.server.downlink(round, d) for d in devices}
        ex = loop.exchange("train", round, payloads, expect="update")
        for key in ("failed", "rejected", "bytes_down"):
            getattr(out, key).update(getattr(ex, key))
        for d, reply in ex.replies.items():
            at, kind = self.clock + local_work(loop.ctx, d), "update"
            if self.fleet is not None:
                up = update_bytes(reply)  # not the counted size: the clock repeats
                at, arrives = self.fleet.flight(d, self.clock, ex.bytes_down[d], up)
                kind = "update" if arrives else "lost"
            self._push(at, d, round, kind, payloads[d], reply, ex.bytes_up[d], ex.seconds[d])

    def collect(self, loop: RoundLoop, round: int,
                out: Exchange) -> tuple[list[str], dict[str, Payload], dict[str, Any]]:
        """Round ``round``: free devices pull the model, then the next ``buffer`` arrivals in time
        order. Fills ``out`` (dispatches' downlinks and failures, arrivals' replies) and returns
        (devices aggregated or failed, their uplinks rebased for staleness, the round's record)."""
        free = sorted(set(loop.ctx.fleet) - self.flying())
        self._dispatch(loop, round, free, out)
        arrived: dict[str, _Flight] = {}
        held: list[_Flight] = []  # a second update of a device already in this buffer
        while len(arrived) < self.buffer and self._flights:
            flight = heapq.heappop(self._flights)
            if flight.device in arrived and flight.kind == "update":
                held.append(flight)
                continue
            self.clock = max(self.clock, flight.arrival)
            if flight.kind == "wake":  # back online: it pulls the model as it stands
                self._dispatch(loop, round, [flight.device], out)
                continue
            # offline before its update arrived: back later, then it pulls
            if flight.kind == "lost":
                why = f"went offline at {self.clock:.1f} s (simulated clock) in flight"
                out.failed[flight.device] = why
                back = self.fleet.next_online(flight.device, self.clock)
                self._push(back, flight.device, round, "wake")
                continue
            arrived[flight.device] = flight
            if len(arrived) < self.buffer:  # it pulls the model as it stands and trains again
                self._dispatch(loop, round, [flight.device], out)
        for flight in held:
            heapq.heappush(self._flights, flight)
        uplinks: dict[str, Payload] = {}
        staleness: dict[str, int] = {}
        for d, flight in sorted(arrived.items()):
            staleness[d] = round - flight.version
            out.replies[d] = flight.reply
            out.bytes_up[d] = flight.bytes_up
            out.seconds[d] = flight.seconds
            current = loop.server.downlink(round, d) if staleness[d] else flight.received
            uplinks[d] = rebase(flight.reply.payload, flight.received, current, staleness[d],
                                loop.ctx.uplink_deltas)
        record = {
            "clock": self.clock,
            "staleness": staleness,
            "staleness_weight": {d: staleness_weight(t) for d, t in staleness.items()},
            "in_flight": len(self._flights),
            "dispatched": sorted(out.bytes_down),
        }
        return sorted(set(arrived) | set(out.failed)), uplinks, record
