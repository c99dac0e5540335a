"""The server side of the request/ack protocol: :class:`MqttServerTransport`, a wire transport
that publishes requests, re-sends unacknowledged ones with back-off, de-duplicates and
acknowledges replies, and counts the bytes it published and received (:class:`ExchangeStats`).
Its open requests, and those that stay open across calls (asynchronous aggregation), are
:mod:`edgefl.transport.mqtt.pending`'s."""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from edgefl.errors import WireError
from edgefl.transport.base import Accept, Delivery
from edgefl.transport.chunks import (
    ChunkSettings,
)
from edgefl.transport.mqtt.closing import DeferredCloses
from edgefl.transport.mqtt.connection import BrokerAddress, Endpoint
from edgefl.transport.mqtt.pending import OpenRequests, _Pending
from edgefl.transport.mqtt.reliable import ack_envelope
from edgefl.transport.mqtt.topics import Topics
from edgefl.wire import REPLY_KINDS, Envelope, Limits, Payload, encode
from edgefl.wire.validate import Routing, parse_status, peek

log = logging.getLogger(__name__)

#: replies at least this large are decoded and checked off paho's network thread: checking a
#: 45 MB update takes tens of ms, during which that thread would read no other device's message
#: and send no acknowledgement or chunk
CHECK_OFF_THREAD_BYTES = 1 << 20
#: Seconds a device whose Last Will arrived has to come back in the same session before its open
#: request fails: a broker restart sends every device's will, and a device reconnects by itself
#: (back-off from 1 s), so a short outage costs no round; a device that does not come back fails
#: its request this long after its will, not at the deadline, and one that restarted (a new
#: session) at once.
RECONNECT_GRACE = 30.0


@dataclass
class ExchangeStats:
    """Bytes actually published per device (retries included) and retries, since the last take()."""

    bytes_down: dict[str, int] = field(default_factory=dict)
    bytes_up: dict[str, int] = field(default_factory=dict)
    retries: dict[str, int] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    rejected: dict[str, int] = field(default_factory=dict)  # messages refused, per sender


RegisterHandler = Callable[[str, bytes], bytes | None]


class MqttServerTransport(OpenRequests, Endpoint):
    """The server's :class:`~edgefl.transport.base.Transport` over MQTT.

    ``on_register(device_id, envelope_bytes)`` is called (on the network thread) for each
    registration message; the bytes it returns are published to that device's downlink.
    """

    def __init__(
        self,
        address: BrokerAddress,
        fleet: str,
        *,
        limits: Limits = Limits(),
        on_register: RegisterHandler | None = None,
        retry_after: float = 2.0,
        retry_max: float = 30.0,
        ack_delay: float = 0.25,
        epoch: str | None = None,
        chunks: ChunkSettings | None = None,
        reconnect_grace: float = RECONNECT_GRACE,
    ):
        topics = Topics(fleet)
        self.epoch = epoch or uuid.uuid4().hex[:12]
        # a server that vanishes mid-run leaves "stopped"; a clean exit says how the run ended
        # (left_as)
        will = json.dumps({"state": "offline", "epoch": self.epoch, "phase": "stopped"}).encode()
        super().__init__(
            address,
            f"edgefl-{fleet}-server",
            topics,
            limits=limits,
            will=(topics.server_status, will),
            chunks=chunks,
        )
        self.fleet = fleet
        self.on_register = on_register
        self.retry_after, self.retry_max = retry_after, retry_max
        # devices re-send after retry_after
        self.ack_delay = max(0.0, min(ack_delay, retry_after / 4))
        self.lock = threading.Condition()
        # the request loop sleeps until wake_at unless woken: by the last reply, or by a reply
        # whose lone acknowledgement would fall due before wake_at (one wake-up, not one per reply)
        self.outstanding = 0
        self.wake_at = 0.0
        self.pending: dict[str, _Pending] = {}
        self.seen_replies: OrderedDict[str, None] = OrderedDict()
        self.cancelled: OrderedDict[str, None] = OrderedDict()  # nonces of requests given up
        self.status: dict[str, str] = {}
        self.sessions: dict[str, str | None] = {}
        self.reconnect_grace = reconnect_grace
        self.status_at: dict[str, float] = {}  # device → wall-clock time its status last changed
        self.last_seen: dict[str, float] = {}  # device → wall-clock time of its last message
        self.stats = ExchangeStats()
        # devices whose retained uplinks were ignored (logged once each)
        self.retained_from: set[str] = set()
        self.retained_ignored = 0
        # the longest recent wait for a request's first acknowledgement (decays ×0.9 per one seen):
        # a request is first re-sent after no less than twice it, so a fleet that acknowledges
        # slowly (a busy broker, loaded devices) is not re-sent to while its requests still queue
        self.ack_wait = 0.0
        # one checker thread: large replies are checked in arrival order, one at a time
        self.checker = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"edgefl-{fleet}-check")
        # an exchange's closing broadcast waits ack_delay for the next request to its devices,
        # which acknowledges their replies as well (edgefl.transport.mqtt.closing)
        self.closes = DeferredCloses(self._announce_closed, self.ack_delay, f"edgefl-{fleet}-close")

    def subscriptions(self) -> list[str]:
        return [self.topics.device("+", leaf) for leaf in ("up", "register", "status")]

    def on_connected(self) -> None:
        online = json.dumps({"state": "online", "epoch": self.epoch}).encode()
        self.client.publish(self.topics.server_status, online, qos=1, retain=True)

    def start(self, wait: float | None = 30.0) -> MqttServerTransport:
        super().start(wait)
        # a new run starts with no "run over" notice in the fleet's broadcast
        self.client.publish(self.topics.broadcast, b"", qos=1, retain=True)
        return self

    def replied(self, device_id: str) -> bool:
        """Whether the device has answered its open request (fleet status)."""
        p = self.pending.get(device_id)
        return p is not None and p.reply is not None

    def publish_fleet_status(self, data: bytes) -> None:
        self.publish(self.topics.fleet_status, data, retain=True)

    def take_stats(self) -> ExchangeStats:
        with self.lock:
            stats, self.stats = self.stats, ExchangeStats()
        return stats

    # -- the Transport protocol --
    def request(
        self, messages: Mapping[str, bytes], *, timeout: float | None, accept: Accept
    ) -> dict[str, Delivery]:
        now = time.monotonic()
        deadline = None if timeout is None else now + timeout
        with self.lock:
            out = self._open(messages, accept, now)
            self.outstanding = sum(1 for d in messages if d in self.pending)
            self.wake_at = now
        for device_id, data in messages.items():
            if device_id not in out:
                self._send(device_id, data)
        self._pump(list(messages), deadline, enough=lambda answered: False)
        closed: dict[tuple[str, int], list[str]] = {}
        with self.lock:
            for device_id in messages:
                if device_id in out:
                    continue
                p = self.pending.pop(device_id, None)
                if p is not None:
                    closed.setdefault((p.kind, p.round), []).append(device_id)
                rejected = tuple(p.rejected) if p is not None else ()
                if p is not None and p.reply is not None:
                    out[device_id] = Delivery(
                        device_id, p.reply, None, p.replied_at - p.sent, p.value, rejected
                    )
                elif p is not None and p.gone:
                    out[device_id] = Delivery(
                        device_id, None, p.gone_why, p.gone - p.sent, rejected=rejected
                    )
                else:
                    state = self.status.get(device_id, "unknown")
                    why = (
                        "no acknowledgement"
                        if p is None or not p.acked
                        else "acknowledged but no reply"
                    )
                    out[device_id] = Delivery(
                        device_id,
                        None,
                        f"deadline of {timeout:g} s passed ({why}; device {state})",
                        time.monotonic() - (p.sent if p else now),
                        rejected=rejected,
                    )
        for (kind, rnd), devices in sorted(closed.items()):
            self.closes.close(kind, rnd, devices)
        return out

    def _first_ack(self, p: _Pending) -> None:
        """Under the lock: learn how long a request waits for its first acknowledgement (from its
        first publication: a re-sent request's ack may answer either copy, so this errs long)."""
        if not p.acked:
            self.ack_wait = max(
                min(time.monotonic() - p.sent, self.retry_max / 2), 0.9 * self.ack_wait
            )

    def on_chunked_sent(self, topic: str, message_id: str, ok: bool) -> None:
        """A request that arrived whole at its device is acknowledged (the device has it)."""
        where = self.topics.parse_device(topic)
        if ok and where is not None:
            with self.lock:
                p = self.pending.get(where[0])
                if p is not None and p.message_id == message_id:
                    p.acked = True

    def on_chunk_rejected(self, topic: str, reason: str) -> None:
        where = self.topics.parse_device(topic)
        if where is not None:
            self._count_rejected(where[0], reason)

    def _seen(self, message_id: str) -> None:
        self.seen_replies[message_id] = None
        while len(self.seen_replies) > 4096:
            self.seen_replies.popitem(last=False)

    def _count_rejected(self, device_id: str, reason: str) -> None:
        """Count a refused message of ``device_id``; while a request to it is open, the exchange's
        record names the reason too."""
        with self.lock:
            self.stats.rejected[device_id] = self.stats.rejected.get(device_id, 0) + 1
            p = self.pending.get(device_id)
            if p is not None and p.reply is None:
                p.rejected.append(reason)

    def _ack_reply(self, r: Routing) -> None:
        self.publish(
            self.topics.device(r.device_id, "down"), ack_envelope(self.fleet, r.device_id, r), qos=0
        )

    def _announce_closed(self, kind: str, rnd: int) -> None:
        """One broadcast acknowledging every reply to the (kind, round) exchange, which is over."""
        env = Envelope(
            "ack",
            rnd,
            "*",
            fleet=self.fleet,
            payload=Payload({}, {"closed": kind, "epoch": self.epoch}),
        )
        # an ack: a lost one costs a re-send
        self.publish(self.topics.broadcast, encode(env), qos=0)

    def accept_retained(self, topic: str) -> bool:
        """A device's uplinks and registrations are never retained: one the broker kept from before
        this server subscribed is ignored (and logged once per device). Its status is retained by
        design (the Last Will)."""
        where = self.topics.parse_device(topic)
        if where is None or where[1] not in ("up", "register"):
            return True
        with self.lock:
            self.retained_ignored += 1
            first = where[0] not in self.retained_from
            self.retained_from.add(where[0])
        if first:
            log.warning(
                "ignoring retained messages on device %s's %s topic (a device's uplinks are never "
                "retained)",
                where[0],
                where[1],
            )
        return False

    def close(self) -> None:
        self.stop()

    def stop(self, graceful: bool = True) -> None:
        self.checker.shutdown(wait=False, cancel_futures=True)
        self.closes.stop(flush=graceful and self.connected.is_set())
        super().stop(graceful)

    def left_as(self, phase: str) -> None:
        """Before a clean exit: the retained server status says the server is gone and how its
        run ended (``finished`` or ``interrupted``); a clean disconnect sends no Last Will."""
        data = json.dumps({"state": "offline", "epoch": self.epoch, "phase": phase}).encode()
        info = self.client.publish(self.topics.server_status, data, qos=1, retain=True)
        try:
            info.wait_for_publish(5)
        except (RuntimeError, ValueError):
            pass

    def announce_end(self) -> None:
        """Tell every device (retained, so also those reconnecting later) that the run is over."""
        self.closes.flush()  # first: the devices' last replies are acknowledged before they leave
        env = Envelope(
            "finish",
            0,
            "*",
            fleet=self.fleet,
            payload=Payload({}, {"run_over": True, "epoch": self.epoch}),
        )
        info = self.client.publish(self.topics.broadcast, encode(env), qos=1, retain=True)
        try:
            info.wait_for_publish(5)
        except (RuntimeError, ValueError):
            pass

    def _send(self, device_id: str, data: bytes) -> None:
        self.closes.requested(device_id)  # a new request acknowledges the device's earlier replies
        self.publish(self.topics.device(device_id, "down"), data)
        with self.lock:
            self.stats.bytes_down[device_id] = self.stats.bytes_down.get(device_id, 0) + len(data)

    # -- incoming --
    def on_message(self, topic: str, data: bytes) -> None:
        where = self.topics.parse_device(topic)
        if where is None:
            return
        device_id, leaf = where
        self.last_seen[device_id] = time.time()
        if leaf == "status":
            try:
                status = parse_status(data)
            except WireError as e:
                self._count_rejected(device_id, str(e))
                raise
            state, session = status
            with self.lock:
                known = self.sessions.get(device_id)
                if state == "offline" and None not in (session, known) and session != known:
                    # the Last Will of a connection before the device's current one (a process
                    # that is gone; the device is back in a new session): it says nothing now
                    log.info("ignoring a Last Will of %s's earlier session %s (now %s)",
                             device_id, session, known)
                    return
                self.status[device_id] = state
                self.status_at[device_id] = time.time()
                if state == "online":
                    self.sessions[device_id] = session
                self._device_status(device_id, state, session)
            return
        try:
            r = peek(data, self.limits)
            if r.device_id != device_id:
                raise WireError(
                    f"envelope names device {r.device_id!r} but came on {device_id!r}'s topic"
                )
            if r.fleet != self.fleet:
                raise WireError(f"envelope is for fleet {r.fleet!r}, not {self.fleet!r}")
        except WireError as e:
            self._count_rejected(device_id, str(e))
            raise
        if leaf == "register":
            if r.kind != "register":
                raise WireError(f"a {r.kind!r} message on the registration topic")
            if self.on_register is not None:
                answer = self.on_register(device_id, data)
                if answer is not None:
                    self.publish(self.topics.device(device_id, "down"), answer)
            return
        if leaf != "up":
            return
        if r.kind == "ack":
            with self.lock:
                p = self.pending.get(device_id)
                if p is not None and r.meta.get("ack") == p.message_id:
                    self._first_ack(p)
                    p.acked = True  # the request loop sees it before its next re-send falls due
            return
        if r.kind not in ("update", "metrics", "done", "error"):
            self._count_rejected(device_id, f"a {r.kind!r} on the uplink")
            raise WireError(f"a device does not send {r.kind!r} messages")
        with self.lock:
            self.stats.bytes_up[device_id] = self.stats.bytes_up.get(device_id, 0) + len(data)
            duplicate = r.message_id in self.seen_replies
            p = self.pending.get(device_id)
            answers = (
                p is not None
                and p.reply is None
                and not p.gone  # failed when its device went offline: a later reply is not used
                and r.kind in (REPLY_KINDS.get(p.kind), "error")
            )
            # a reply naming another round than its open request's is checked, and refused, when
            # it claims that request (its nonce) or a later round (in an asynchronous run the
            # round is the model version an update was trained from: one it was not sent, or
            # one from the future); a reply of an earlier round is late
            candidate = (
                not duplicate
                and answers
                and (r.round == p.round or r.nonce == p.nonce or r.round > p.round)
            )
            if candidate:
                self._seen(r.message_id)
        if candidate:
            if len(data) >= CHECK_OFF_THREAD_BYTES:
                self.checker.submit(self._take_reply_logged, device_id, p, r, data)
            else:
                self._take_reply(device_id, p, r, data)
            return
        with self.lock:
            if not duplicate and r.nonce in self.cancelled:
                log.info(
                    "%s's %s for round %d came after its request was given up: not used",
                    device_id, r.kind, r.round,
                )
            elif not duplicate:
                self.stats.dropped.append(f"{device_id}:{r.kind}:{r.round}")
                open_request = "" if p is None else f" (its open request: {p.kind} round {p.round})"
                log.warning(
                    "dropped a late or unsolicited %s from %s for round %d%s",
                    r.kind, device_id, r.round, open_request,
                )
        # acknowledge a duplicate or a late reply at once: the device stops re-sending it
        self._ack_reply(r)

    def _take_reply(self, device_id: str, p: _Pending, r: Routing, data: bytes) -> None:
        """Decode and check a reply outside the lock; the first accepted reply wins, a refused one
        is counted and never takes the real one's place."""
        try:
            value = p.accept(device_id, bytes(data)) if p.accept is not None else None
        except WireError as e:
            log.warning("refused a %s from %s for round %d: %s", r.kind, device_id, r.round, e)
            self._count_rejected(device_id, str(e))
            self._ack_reply(r)  # its sender may stop re-sending it: it will never be accepted
            return
        with self.lock:
            if self.pending.get(device_id) is p and p.reply is None and not p.gone:
                self._first_ack(p)  # a reply acknowledges its request
                p.reply, p.replied_at, p.acked, p.reply_routing, p.value = (
                    bytes(data),
                    time.monotonic(),
                    True,
                    r,
                    value,
                )
                self.outstanding -= 1
                if self.outstanding <= 0 or p.replied_at + self.ack_delay < self.wake_at:
                    self.lock.notify_all()
                # acknowledged by the exchange's closing broadcast (or the device's next request),
                # or alone after ack_delay
                return
        self._ack_reply(r)  # the exchange closed while it was checked

    def _take_reply_logged(self, device_id: str, p: _Pending, r: Routing, data: bytes) -> None:
        try:
            self._take_reply(device_id, p, r, data)
        except Exception:  # the checker thread must go on serving
            log.exception("failed to take the %s of %s for round %d", r.kind, device_id, r.round)
