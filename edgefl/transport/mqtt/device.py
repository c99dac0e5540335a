"""The device side of the request/ack protocol: :class:`MqttDeviceEndpoint`, a device's inbox of
requests (de-duplicated, acknowledged) and its replies (re-sent until acknowledged)."""

from __future__ import annotations

import json
import logging
import queue
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt

from edgefl.errors import WireError
from edgefl.transport.chunks import (
    ChunkSettings,
)
from edgefl.transport.mqtt.connection import BrokerAddress, Endpoint
from edgefl.transport.mqtt.reliable import ack_envelope, retry_delay
from edgefl.transport.mqtt.topics import Topics
from edgefl.wire import REPLY_KINDS, Limits
from edgefl.wire.schema import SESSION_HEX, device_status
from edgefl.wire.validate import Routing, peek

log = logging.getLogger(__name__)


@dataclass
class _Unacked:
    topic: str
    data: bytes
    next_retry: float
    retry_every: float
    attempts: int = 0
    request: tuple[str, int] = ("", -1)  # (kind, round) of the request it answers
    # paho's record of its last copy (None: in chunks): while that copy has not left (a slow
    # uplink, or queued while the connection is down), another would only queue behind it
    sending: Any = None


def _leaving(info: Any) -> bool:
    """Whether a published copy is still queued or in flight in paho (not yet with the broker)."""
    if info is None or info.rc not in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN):
        return False
    try:
        return not info.is_published()
    except RuntimeError:
        # published while the connection was down (NO_CONN): paho keeps it and sends it once
        # connected again, but is_published() refuses to say for it
        return not info._published


class MqttDeviceEndpoint(Endpoint):
    """A device's connection: its inbox of requests (de-duplicated, acknowledged) and its replies.

    The device runtime reads :attr:`inbox` (tuples ``(kind, routing, bytes)`` with kind "request",
    "assign" or "broadcast", or ``("server", None, status_dict)``), answers with :meth:`reply`, and
    calls :meth:`retry_unacked` now and then.
    """

    def __init__(
        self,
        address: BrokerAddress,
        fleet: str,
        device_id: str,
        *,
        limits: Limits = Limits(),
        retry_after: float = 2.0,
        retry_max: float = 30.0,
        max_attempts: int = 20,
        ack_delay: float = 0.25,
        client_id: str | None = None,
        will: bool = True,
        chunks: ChunkSettings | None = None,
    ):
        topics = Topics(fleet)
        # this endpoint's session, in its "online" and in its Last Will: a will of the same
        # session is a connection that may come back, another session is a new process
        self.session = secrets.token_hex(SESSION_HEX // 2)
        super().__init__(
            address,
            client_id or f"edgefl-{fleet}-{device_id}",
            topics,
            limits=limits,
            will=(
                (topics.device(device_id, "status"), device_status("offline", self.session))
                if will
                else None
            ),
            chunks=chunks,
        )
        self.fleet, self.device_id = fleet, device_id
        self.announce = will
        # C-implemented: a KeyboardInterrupt from a signal cannot land inside its locking (it can in
        # queue.Queue's Python-level Condition, and leave its lock taken or released for paho's
        # thread: edgefl.runtime.interrupt)
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.lock = threading.Lock()
        # request id → reply (None: in progress)
        self.handled: OrderedDict[str, bytes | None] = OrderedDict()
        self.unacked: dict[str, _Unacked] = {}
        self.retry_after, self.retry_max, self.max_attempts = retry_after, retry_max, max_attempts
        # the server re-sends an unacknowledged request after retry_after: acknowledge well before
        self.ack_delay = max(0.0, min(ack_delay, retry_after / 4))
        # request id → (due, routing)
        self.acks_due: OrderedDict[str, tuple[float, Routing]] = OrderedDict()
        self.acks_wake = threading.Condition(self.lock)
        self.acker: threading.Thread | None = None
        self.stopping = False

    def subscriptions(self) -> list[str]:
        return [
            self.topics.device(self.device_id, "down"),
            self.topics.broadcast,
            self.topics.server_status,
        ]

    def on_connected(self) -> None:
        if self.announce:  # a helper connection (registration check) does not announce liveness
            self.client.publish(
                self.topics.device(self.device_id, "status"),
                device_status("online", self.session),
                qos=1,
                retain=True,
            )

    def start(self, wait: float | None = 30.0) -> MqttDeviceEndpoint:
        if self.ack_delay > 0 and self.acker is None:
            self.acker = threading.Thread(
                target=self._ack_when_due, name=f"{self.client_id}-acks", daemon=True
            )
            self.acker.start()
        super().start(wait)
        return self

    def stop(self, graceful: bool = True) -> None:
        with self.lock:
            self.stopping = True
            self.acks_due.clear()
            self.acks_wake.notify_all()
        if graceful and self.connected.is_set() and self.announce:
            info = self.client.publish(
                self.topics.device(self.device_id, "status"),
                device_status("offline", self.session),
                qos=1,
                retain=True,
            )
            try:
                info.wait_for_publish(2)
            except (RuntimeError, ValueError):
                pass
        super().stop(graceful)

    def on_message(self, topic: str, data: bytes) -> None:
        if topic == self.topics.server_status:
            try:
                status = json.loads(data) if data else {}
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise WireError("server status is not JSON") from None
            if isinstance(status, dict):
                self.inbox.put(("server", None, status))
            return
        if topic == self.topics.broadcast:
            if not data:
                return
            r = peek(data, self.limits)
            if r.kind == "ack":  # an exchange is over: every reply to it is acknowledged
                closed = (str(r.meta.get("closed", "")), r.round)
                with self.lock:
                    for key in [k for k, u in self.unacked.items() if u.request == closed]:
                        del self.unacked[key]
                return
            self.inbox.put(("broadcast", r, bytes(data)))
            return
        r = peek(data, self.limits)
        if r.fleet != self.fleet or r.device_id != self.device_id:
            raise WireError(f"a downlink for {r.device_id!r} in fleet {r.fleet!r}")
        if r.kind == "ack":
            with self.lock:
                self.unacked.pop(str(r.meta.get("ack", "")), None)
            return
        if r.kind == "assign":
            self.inbox.put(("assign", r, bytes(data)))
            return
        if r.kind not in REPLY_KINDS:
            raise WireError(f"a device does not handle {r.kind!r} messages")
        with self.lock:
            seen = r.message_id in self.handled
            cached = self.handled.get(r.message_id)
            if not seen:
                self.handled[r.message_id] = None
                while len(self.handled) > 64:
                    self.handled.popitem(last=False)
                # a new request: the server keeps one request open per device, so it has every
                # reply this device sent before, or no longer wants it (as a closing broadcast says)
                self.unacked.clear()
        up = self.topics.device(self.device_id, "up")
        if not seen:
            self._ack_later(r)
            self.inbox.put(("request", r, bytes(data)))
        elif cached is not None:  # our reply was lost: send it again (it acknowledges too)
            self.publish(up, cached)
        else:  # a re-send while we work on it: the server missed our ack
            self._ack(r)

    def _ack_later(self, request: Routing) -> None:
        """Acknowledge ``request`` after ``ack_delay`` unless its reply has gone out by then."""
        if self.ack_delay <= 0 or self.acker is None:
            self._ack(request)
            return
        # no notify: the idle acker looks every ack_delay (a wake-up saved per request)
        with self.lock:
            self.acks_due[request.message_id] = (time.monotonic() + self.ack_delay, request)

    def _ack(self, request: Routing) -> None:
        self.publish(
            self.topics.device(self.device_id, "up"),
            ack_envelope(self.fleet, self.device_id, request),
            qos=0,
        )

    def _ack_when_due(self) -> None:
        """The acker thread: one per endpoint (a thread per request costs a thread start, ~1 ms
        on a busy 2-core device). Entries are due in arrival order (one constant delay); an ack
        goes out between ack_delay and 2·ack_delay after its request, far below retry_after."""
        while True:
            with self.lock:
                while not self.stopping and (
                    not self.acks_due or next(iter(self.acks_due.values()))[0] > time.monotonic()
                ):
                    timeout = (
                        next(iter(self.acks_due.values()))[0] - time.monotonic()
                        if self.acks_due
                        else self.ack_delay
                    )
                    self.acks_wake.wait(timeout)
                if self.stopping:
                    return
                _, (_, request) = self.acks_due.popitem(last=False)
            try:
                self._ack(request)
            except Exception:  # noqa: BLE001 - the acker must survive to acknowledge the next one
                log.exception("device %s: could not acknowledge a request", self.device_id)

    def reply(self, request: Routing, data: bytes) -> None:
        """Publish the reply to ``request`` and keep re-sending it until the server acknowledges."""
        reply_id = peek(data, self.limits).message_id
        topic = self.topics.device(self.device_id, "up")
        with self.lock:
            self.handled[request.message_id] = data
            self.acks_due.pop(request.message_id, None)  # the reply acknowledges the request
            first = retry_delay(self.retry_after, len(data))
            self.unacked[reply_id] = _Unacked(
                topic, data, time.monotonic() + first, first, request=(request.kind, request.round)
            )
        info = self.publish(topic, data)
        with self.lock:
            if reply_id in self.unacked:
                self.unacked[reply_id].sending = info

    def send(self, leaf: str, data: bytes) -> None:
        self.publish(self.topics.device(self.device_id, leaf), data)

    def on_chunked_sent(self, topic: str, message_id: str, ok: bool) -> None:
        """A reply that arrived whole at the server is acknowledged: the server handles every
        message it reassembles (accepts, or refuses and counts it)."""
        if ok:
            with self.lock:
                self.unacked.pop(message_id, None)

    def retry_unacked(self) -> None:
        now = time.monotonic()
        with self.lock:
            due = []
            for key, u in self.unacked.items():
                if now >= u.next_retry and self.chunker.active(u.topic, bytes.fromhex(key)):
                    # in chunks: re-sent by their progress, not by this clock
                    u.next_retry = now + u.retry_every
                elif now >= u.next_retry and _leaving(u.sending):
                    # its last copy is still on its way out: paho delivers it (on reconnecting too)
                    u.next_retry = now + u.retry_every
                elif now >= u.next_retry:
                    due.append((key, u))
            for key, u in due:
                u.attempts += 1
                if u.attempts > self.max_attempts:
                    log.warning(
                        "device %s: giving up on a reply after %d attempts",
                        self.device_id,
                        u.attempts - 1,
                    )
                    del self.unacked[key]
                    continue
                u.retry_every = min(self.retry_max, u.retry_every * 2)
                u.next_retry = now + u.retry_every
        for key, u in due:
            if key in self.unacked:
                log.info("device %s: no acknowledgement for a reply; re-sending", self.device_id)
                u.sending = self.publish(u.topic, u.data)
