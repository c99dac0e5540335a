"""The server's open requests: each waits for its reply, re-sent with back-off until the device
acknowledges it (:class:`OpenRequests`, a part of
:class:`~edgefl.transport.mqtt.server.MqttServerTransport`).

An exchange (``request``) opens requests, waits for every reply or the deadline and closes them.
Requests can also stay open across calls, as asynchronous aggregation needs them
(:mod:`edgefl.runtime.live`): :meth:`OpenRequests.submit` publishes without waiting,
:meth:`OpenRequests.arrivals` takes replies as they come, :meth:`OpenRequests.cancel` gives up
on open ones (a reply that comes later is not used).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgefl.errors import WireError
from edgefl.transport.base import Accept, Delivery
from edgefl.transport.mqtt.reliable import retry_delay
from edgefl.wire.validate import Routing, peek

if TYPE_CHECKING:
    from edgefl.transport.chunks.sender import ChunkSender
    from edgefl.transport.mqtt.topics import Topics
    from edgefl.wire import Limits

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    message_id: str
    round: int
    kind: str
    data: bytes
    sent: float
    next_retry: float
    retry_every: float
    acked: bool = False
    reply: bytes | None = None
    replied_at: float = 0.0
    reply_acked: bool = False
    reply_routing: Routing | None = None
    published: int = 0
    attempts: int = 0
    accept: Accept | None = None
    value: object = None
    rejected: list[str] = field(default_factory=list)
    nonce: str = ""  # the request's, which its reply echoes
    # the device's session when the request opened (its last "online"; None: not known)
    session: str | None = None
    # when (monotonic) its Last Will arrived while the request waited for its reply (0.0: it did
    # not, or the device came back in the same session): the device has the transport's
    # reconnect_grace to come back before the request fails
    dropped: float = 0.0
    # when (monotonic) the request failed because its device left (0.0: it did not): its Last
    # Will and no return within the grace, or a new session (the process restarted); no later
    # reply is taken
    gone: float = 0.0
    gone_why: str = ""  # why, set with ``gone`` (:meth:`OpenRequests._gone`)


class OpenRequests:
    """Open requests of the server's transport: opening, re-sending, acknowledging replies, and
    the requests that stay open across calls. The transport provides the attributes below, and
    ``_send(device_id, data)`` and ``_ack_reply(routing)``."""

    lock: threading.Condition
    pending: dict[str, _Pending]
    cancelled: OrderedDict[str, None]  # nonces of requests given up
    limits: Limits
    topics: Topics
    chunker: ChunkSender
    stats: Any  # ExchangeStats
    retry_after: float
    retry_max: float
    ack_delay: float
    ack_wait: float
    outstanding: int
    wake_at: float
    sessions: dict[str, str | None]  # device → the session of its last "online"
    # seconds a device whose Last Will arrived has to come back (in the same session) before its
    # open request fails
    reconnect_grace: float

    def _open(
        self, messages: Mapping[str, bytes], accept: Accept, now: float
    ) -> dict[str, Delivery]:
        """Under the lock: an open request per message; a Delivery for each that cannot be sent."""
        out: dict[str, Delivery] = {}
        for device_id, data in messages.items():
            try:
                r = peek(data, self.limits)
            except WireError as e:  # e.g. larger than the limit: never published
                out[device_id] = Delivery(device_id, None, f"not sent: {e}")
                continue
            first = min(
                self.retry_max, max(retry_delay(self.retry_after, len(data)), 2 * self.ack_wait)
            )
            self.pending[device_id] = _Pending(
                r.message_id,
                r.round,
                r.kind,
                data,
                now,
                now + first,
                first,
                accept=accept,
                nonce=r.nonce,
                session=self.sessions.get(device_id),
            )
        return out

    def _gone(self, p: _Pending, why: str) -> None:
        """Under the lock: the request fails because its device left (``why``)."""
        p.gone, p.gone_why = time.monotonic(), why
        self.outstanding -= 1
        self.lock.notify_all()

    def _device_status(self, device_id: str, state: str, session: str | None) -> None:
        """Under the lock: what a device's status (``online``/``offline`` and its session) means
        for its open request. Its Last Will starts the reconnect grace; an "online" in the same
        session (the connection came back: the broker restarted, the Wi-Fi dropped) ends it and
        re-sends an unacknowledged request at once; an "online" in another session (the process
        restarted: what it was working on is lost) fails the request at once."""
        p = self.pending.get(device_id)
        if p is None or p.reply is not None or p.gone:
            return
        now = time.monotonic()
        if p.session is None:  # not known when the request opened: the first one seen since
            p.session = session
        if state == "offline":
            if not p.dropped:
                p.dropped = now
                self.lock.notify_all()  # the request loop wakes at the end of the grace
        elif None not in (session, p.session) and session != p.session:
            self._gone(p, f"device restarted {now - p.sent:.1f} s after the request was sent "
                          "(a new session: its work in flight is lost), before it replied")
        elif p.dropped:
            log.info("%s is back (its session %s) after %.1f s offline; its %s round %d goes on",
                     device_id, session, now - p.dropped, p.kind, p.round)
            p.dropped = 0.0
            if not p.acked:  # its copy may have been lost with the connection: re-send now
                p.next_retry = now
                self.lock.notify_all()

    def _grace_over(self, devices: list[str], now: float) -> None:
        """Under the lock: requests whose device's Last Will is older than the grace fail."""
        for d in devices:
            p = self.pending.get(d)
            if (p is not None and p.dropped and p.reply is None and not p.gone
                    and now >= p.dropped + self.reconnect_grace):
                self._gone(p, f"device went offline {p.dropped - p.sent:.1f} s after the request "
                              f"was sent (its Last Will) and did not come back within "
                              f"{self.reconnect_grace:g} s, before it replied")

    def _pump(
        self, devices: list[str], deadline: float | None, enough: Callable[[int], bool]
    ) -> None:
        """Re-send the unacknowledged requests of ``devices`` (with back-off) and acknowledge
        replies that wait for it, until none of ``devices`` waits (a device that went offline
        does not), ``enough(answered)`` (answered: replied or gone) or the deadline."""
        while True:
            resend, acks = [], []
            with self.lock:
                now = time.monotonic()
                self._grace_over(devices, now)
                waiting = [
                    d
                    for d in devices
                    if d in self.pending
                    and self.pending[d].reply is None
                    and not self.pending[d].gone
                ]
                answered = sum(1 for d in devices if d in self.pending) - len(waiting)
                if not waiting or enough(answered) or (deadline is not None and now >= deadline):
                    break
                for d in waiting:
                    p = self.pending[d]
                    if (
                        not p.acked
                        and now >= p.next_retry
                        and self.chunker.active(
                            self.topics.device(d, "down"), bytes.fromhex(p.message_id)
                        )
                    ):
                        # in chunks: re-sent by their progress, not by this clock
                        p.next_retry = now + p.retry_every
                    if not p.acked and now >= p.next_retry:
                        p.retry_every = min(self.retry_max, p.retry_every * 2)
                        p.next_retry = now + p.retry_every
                        p.attempts += 1
                        self.stats.retries[d] = self.stats.retries.get(d, 0) + 1
                        resend.append((d, p))
                # every open request's reply: this exchange's, or one still open from before
                replied = [
                    p for p in self.pending.values() if p.reply is not None and not p.reply_acked
                ]
                for p in replied:
                    if now >= p.replied_at + self.ack_delay:
                        p.reply_acked = True  # the exchange goes on: acknowledge it alone
                        acks.append(p)
                if not resend and not acks:
                    wake = min(self.pending[d].next_retry for d in waiting)
                    graces = [self.pending[d].dropped + self.reconnect_grace for d in waiting
                              if self.pending[d].dropped]
                    wake = min([wake, *graces])
                    wake = min([wake, *(p.replied_at + self.ack_delay for p in replied)])
                    if deadline is not None:
                        wake = min(wake, deadline)
                    pause = max(0.001, min(1.0, wake - now))
                    self.wake_at = now + pause
                    self.lock.wait(pause)
            # publish outside the lock: paho's network thread takes it in on_message
            for d, p in resend:
                log.info(
                    "no acknowledgement from %s for %s round %d; re-sending", d, p.kind, p.round
                )
                self._send(d, p.data)
            for p in acks:
                self._ack_reply(p.reply_routing)

    # -- requests that stay open (asynchronous aggregation) --
    def submit(self, messages: Mapping[str, bytes], *, accept: Accept) -> dict[str, Delivery]:
        """Publish ``messages`` without waiting: each request stays open (re-sent while
        :meth:`arrivals` waits) until :meth:`arrivals` takes its reply or :meth:`cancel` drops
        it. Returns a Delivery (``error`` set) for each message that could not be sent."""
        with self.lock:
            out = self._open(messages, accept, time.monotonic())
        for device_id, data in messages.items():
            if device_id not in out:
                self._send(device_id, data)
        return out

    def arrivals(
        self, device_ids: Collection[str], *, most: int, timeout: float | None
    ) -> dict[str, Delivery]:
        """Wait until one of ``device_ids``' open requests is answered (or ``timeout`` passes);
        return up to ``most`` answered ones, earliest first, each closed and its reply
        acknowledged; a request whose device went offline counts as answered, failed (its
        Delivery's ``error`` says so). Empty when none was answered in time (or none of them is
        open)."""
        devices = list(device_ids)

        def over(p: _Pending) -> bool:
            return p.reply is not None or bool(p.gone)

        with self.lock:
            if not any(d in self.pending and over(self.pending[d]) for d in devices):
                self.outstanding = 1  # woken by the first reply
            self.wake_at = time.monotonic()
        deadline = None if timeout is None else time.monotonic() + timeout
        self._pump(devices, deadline, enough=lambda answered: answered >= 1)
        out: dict[str, Delivery] = {}
        acks = []
        with self.lock:
            done = sorted(
                (self.pending[d].replied_at or self.pending[d].gone, d)
                for d in devices
                if d in self.pending and over(self.pending[d])
            )
            for _, d in done[: max(most, 0)]:
                p = self.pending.pop(d)
                if p.reply is None:
                    out[d] = Delivery(
                        d, None, p.gone_why, p.gone - p.sent, rejected=tuple(p.rejected)
                    )
                    continue
                out[d] = Delivery(
                    d, p.reply, None, p.replied_at - p.sent, p.value, tuple(p.rejected)
                )
                if not p.reply_acked:
                    p.reply_acked = True
                    acks.append(p.reply_routing)
        for r in acks:
            self._ack_reply(r)
        return out

    def cancel(self, device_ids: Collection[str], reason: str) -> dict[str, Delivery]:
        """Give up on the open requests of ``device_ids`` (a reply that comes later is not used);
        a Delivery with ``reason`` as its error for each."""
        out: dict[str, Delivery] = {}
        acks = []
        with self.lock:
            for d in device_ids:
                p = self.pending.pop(d, None)
                if p is None:
                    continue
                out[d] = Delivery(
                    d, None, reason, time.monotonic() - p.sent, rejected=tuple(p.rejected)
                )
                self.cancelled[p.nonce] = None
                while len(self.cancelled) > 4096:
                    self.cancelled.popitem(last=False)
                if p.reply is not None and not p.reply_acked:
                    acks.append(p.reply_routing)
        for r in acks:
            self._ack_reply(r)
        return out
