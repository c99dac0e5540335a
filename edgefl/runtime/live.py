"""Asynchronous buffered aggregation (FedBuff) in real time: over MQTT, ``edgefl server`` and
``edgefl simulate --transport mqtt`` (``--aggregation async --buffer K``).

The in-memory mode (:mod:`edgefl.runtime.buffered`) simulates time; here time is the wall clock
and requests stay open across rounds (a transport with ``submit``, ``arrivals`` and ``cancel``:
:class:`~edgefl.transport.base.Encoded` over the MQTT server transport). One round of the loop
is one aggregation step:

1. a device whose update is in flight longer than the deadline is given up on (failed in this
   round's record) and is free again; one that left (its Last Will and no return within the
   transport's reconnect grace, or a restart) arrives failed from the transport;
2. every free device pulls the newest model (a train request whose round is the model
   version: the number of aggregations behind it) and trains;
3. the server takes updates as they arrive, one per device, until it holds ``K`` (at most the
   fleet's reachable devices) or the deadline passes; a device whose update arrived before the
   buffer is full gets new work at once, on the model as it stands (the same version);
4. the method's own ``aggregate`` runs on the buffer, each update rebased for its staleness
   τ = round − version with weight s(τ) = 1/√(1+τ) (:func:`~edgefl.runtime.buffered.rebase`,
   the same as in memory): late updates are used, not dropped.

Each reply echoes the version it was trained from; the transport holds it against the open
request (:func:`edgefl.wire.validate.check_reply`): a version from the future, or one the device
was not sent, is refused with a logged reason, counted in the round's ``rejected``, and the
server goes on waiting for that device's real update. Per-round evaluation asks only the devices
that are not training at that moment. Updates still in flight when the run ends are not used:
their requests are cancelled before the finish exchange (a device finishes its local work, its
late update is dropped, then it takes the finish request).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from edgefl.runtime.buffered import rebase, staleness_weight
from edgefl.wire import Envelope, Payload, new_nonce
from edgefl.wire.schema import Expectation
from edgefl.wire.validate import check_reply

log = logging.getLogger(__name__)

# the round loop (edgefl.runtime.loop.RoundLoop) and its Exchange are passed in, not imported: the
# loop imports this module
RoundLoop = Exchange = Any


@dataclass
class _Flight:
    version: int  # the aggregation whose model it trains on (its request's round)
    received: Payload  # the downlink it answers
    sent: float  # monotonic time of the request


class LiveRounds:
    """The updates in flight of an asynchronous run over a transport whose requests stay open."""

    def __init__(self, buffer: int):
        if buffer < 1:
            raise ValueError(f"the buffer must hold at least one update (got {buffer})")
        self.buffer = buffer
        self.flights: dict[str, _Flight] = {}
        self.started: float | None = None  # monotonic time of the first request

    def busy(self) -> set[str]:
        """Devices training now (not asked to evaluate)."""
        return set(self.flights)

    def _dispatch(self, loop: RoundLoop, round: int, devices: list[str], out: Exchange) -> None:
        """Send ``devices`` the current model (version ``round``) without waiting for them."""
        if not devices:
            return
        now = time.monotonic()
        self.started = now if self.started is None else self.started
        messages, wants, payloads = {}, {}, {}
        for d in devices:
            payloads[d] = loop.server.downlink(round, d)
            record = loop.ctx.fleet[d]
            env = Envelope(
                kind="train",
                round=round,
                device_id=d,
                fleet=loop.settings.fleet,
                algorithm=loop.settings.algorithm,
                tier=record.spec.tier,
                payload=payloads[d],
                run=loop.settings.run_id,
                nonce=new_nonce(),
            )
            messages[d] = env
            wants[d] = Expectation(
                "train",
                round,
                d,
                env.fleet,
                env.tier,
                env.run,
                env.nonce,
                env.algorithm,
                arrays=loop.server.expected_uplink(d),
                max_samples=record.num_samples or None,
            )

        def accept(device_id: str, reply: Envelope) -> Envelope:
            check_reply(reply, wants[device_id])  # a WireError refuses it; the transport waits on
            return reply

        for d, delivery in loop.transport.submit(messages, accept=accept).items():
            out.bytes_down[d] = out.bytes_down.get(d, 0) + delivery.bytes_down
            if delivery.error is not None:
                out.failed[d] = delivery.error
                log.warning(
                    "round %d: could not send %s the model: %s", round + 1, d, delivery.error
                )
            else:
                self.flights[d] = _Flight(round, payloads[d], now)

    def _give_up(self, loop: RoundLoop, round: int, out: Exchange) -> None:
        """Flights past the deadline: failed. (A device that left mid-flight is the transport's to
        tell: its request arrives failed once its reconnect grace is over, or at once when it
        restarted; a Last Will alone may be a broker restart it comes back from.)"""
        now, timeout = time.monotonic(), loop.settings.timeout
        late = [
            d for d, f in self.flights.items() if timeout is not None and now - f.sent > timeout
        ]
        why = f"no update within the deadline of {timeout} s"
        for d, delivery in loop.transport.cancel(late, why).items():
            out.failed[d] = why
            if delivery.rejected:
                out.rejected[d] = out.rejected.get(d, 0) + len(delivery.rejected)
        for d in late:
            self.flights.pop(d, None)

    def collect(
        self, loop: RoundLoop, round: int, out: Exchange
    ) -> tuple[list[str], dict[str, Payload], dict[str, Any]]:
        """Round ``round``: free devices pull the model, then the next ``K`` arrivals (or what
        came before the deadline). Fills ``out`` and returns (devices aggregated or failed, their
        uplinks rebased for staleness, the round's record)."""
        self._give_up(loop, round, out)
        reachable = loop.reachable(sorted(loop.ctx.fleet), round + 1)
        self._dispatch(loop, round, [d for d in reachable if d not in self.flights], out)
        want = min(self.buffer, len(reachable))
        timeout = loop.settings.timeout
        end = None if timeout is None else time.monotonic() + timeout
        arrived: dict[str, tuple[_Flight, Envelope]] = {}
        while len(arrived) < want:
            waiting = [d for d in self.flights if d not in arrived]
            left = None if end is None else end - time.monotonic()
            if not waiting or (left is not None and left <= 0):
                break
            got = loop.transport.arrivals(waiting, most=want - len(arrived), timeout=left)
            for d, delivery in got.items():  # earliest first
                flight = self.flights.pop(d)
                out.bytes_up[d] = delivery.bytes_up
                out.seconds[d] = delivery.seconds
                if delivery.rejected:
                    out.rejected[d] = out.rejected.get(d, 0) + len(delivery.rejected)
                    log.warning(
                        "round %d: refused %d invalid replies from %s (first: %s)",
                        round + 1,
                        len(delivery.rejected),
                        d,
                        delivery.rejected[0],
                    )
                reply = delivery.reply
                if reply is None or reply.kind == "error":
                    why = (
                        delivery.error
                        if reply is None
                        else str(reply.payload.meta.get("reason", "device error"))
                    )
                    out.failed[d] = why
                    log.warning("round %d: device %s failed its train: %s", round + 1, d, why)
                    continue
                arrived[d] = (flight, reply)
                if len(arrived) < want:  # it pulls the model as it stands and trains again
                    self._dispatch(loop, round, [d], out)
        uplinks: dict[str, Payload] = {}
        staleness: dict[str, int] = {}
        for d, (flight, reply) in sorted(arrived.items()):
            staleness[d] = round - flight.version
            out.replies[d] = reply
            current = loop.server.downlink(round, d) if staleness[d] else flight.received
            deltas = loop.ctx.uplink_deltas
            uplinks[d] = rebase(reply.payload, flight.received, current, staleness[d], deltas)
        if len(arrived) < want:
            log.warning(
                "round %d: %d of %d updates arrived within the deadline; aggregating them",
                round + 1,
                len(arrived),
                want,
            )
        record = {
            "clock": 0.0 if self.started is None else time.monotonic() - self.started,  # seconds
            "buffer": want,
            "staleness": staleness,
            "staleness_weight": {d: staleness_weight(t) for d, t in staleness.items()},
            "in_flight": len(self.flights),
            "dispatched": sorted(out.bytes_down),
        }
        return sorted(set(arrived) | set(out.failed)), uplinks, record

    def close(self, loop: RoundLoop) -> None:
        """The run is over: updates still in flight are not used (their requests cancelled)."""
        if self.flights:
            log.info(
                "%d updates in flight when the rounds ended are not used (%s)",
                len(self.flights),
                ", ".join(sorted(self.flights)),
            )
            loop.transport.cancel(list(self.flights), "the rounds ended")
            self.flights.clear()
