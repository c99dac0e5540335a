"""MQTT transport (paho-mqtt 2.x): the server's :class:`Transport` and the device's endpoint.

Topics, all under ``edgefl/<fleet>/``::

    devices/<id>/down       server → device   train / evaluate / finish / assign / ack envelopes
    devices/<id>/up         device → server   update / metrics / done / error / ack envelopes
    devices/<id>/register   device → server   register envelopes (profile, readiness)
    devices/<id>/status     device, retained  "online" / "offline" (the Last Will)
    server/status           server, retained  {"state": "online"|"offline", "epoch": ...} (Last Will)
    broadcast               server, retained  the end of a run (a "finish" envelope for device "*")
    server/fleet            server, retained  fleet status JSON (edgefl.runtime.status)
    devices/<id>/model      operator/server, retained  model rollout commands (edgefl.rollout)
    devices/<id>/active     device, retained  the device's active model version (edgefl.rollout)

A device writes only its own uplink topics in its own fleet, never its downlinks (the Mosquitto
ACL in ``broker/`` enforces it), and reads its own downlinks, the broadcast and the server status.

Delivery: QoS 1, subscriptions made in ``on_connect`` (so they survive reconnects), persistent
sessions with stable client ids (MQTT 5 session expiry where the broker speaks 5, else
``clean_session=False``), and because the broker's QoS is not trusted (queues overflow, brokers
restart without persistence), an application-level protocol on top:

- the receiver of a request (train/evaluate/finish) answers an ``ack`` envelope naming its
  message id unless its reply is ready within ``ack_delay`` (a reply acknowledges its request,
  so quick work costs no extra message); the server re-publishes an unacknowledged request with
  back-off until the reply or the deadline;
- the server acknowledges every reply; a device re-publishes an unacknowledged reply with back-off.
  When the exchange closes (all replies in, or the deadline) within ``ack_delay`` of a reply, one
  non-retained ``ack`` on the fleet's broadcast topic ("closed": kind, round) acknowledges every
  reply to that exchange at once: either the server has the reply or it no longer wants it.
  Replies that wait longer, duplicates and late replies are acknowledged one by one;
- acks travel at QoS 0: losing one costs a re-send, which the other side answers again, so the
  broker's acknowledgement of an ack would buy nothing (requests and replies stay at QoS 1);
- both sides de-duplicate by message id (a device answers a repeated request with its cached
  reply instead of training twice; the server counts a reply once).

Envelopes longer than :attr:`ChunkSettings.threshold` (4 MiB) travel in chunks on the same topics,
paced by acknowledged bytes (:mod:`edgefl.transport.chunks`, ``docs/wire.md``); a reassembled
envelope goes through everything below exactly as one that came whole.

Every message is size-checked against :class:`edgefl.wire.Limits` by edgefl itself before it is
published and before anything parses it, and only the routing header is read here
(:func:`edgefl.wire.validate.peek`) before a reply is handed to the caller's ``accept``, which
decodes and checks it against its request. The first *accepted* reply per device and request is
kept; a refused one is logged, counted (``ExchangeStats.rejected``, ``Delivery.rejected``) and
acknowledged so its sender stops re-sending it, and the exchange goes on waiting for the real one.
Nothing here raises on what the network sends.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import queue
import socket
import ssl
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote, urlparse

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edgefl.errors import AuthenticationError, ConfigError, TransportError, WireError
from edgefl.transport.base import Accept, Delivery
from edgefl.transport.chunks import (
    ChunkRefused,
    ChunkSender,
    ChunkSettings,
    Reassembler,
    is_ack,
    is_chunk,
)
from edgefl.wire import REPLY_KINDS, Envelope, Limits, Payload, encode
from edgefl.wire.validate import Routing, peek

log = logging.getLogger(__name__)

SESSION_EXPIRY_SECONDS = 24 * 3600


# --- addresses and topics ---------------------------------------------------------------------


@dataclass(frozen=True)
class BrokerAddress:
    """``mqtt://[user[:password]@]host[:port][?protocol=5|3.1.1|auto&ca=FILE&cert=FILE&key=FILE&insecure=1]``.

    ``mqtts://`` turns TLS on (default port 8883; ``ca`` names a CA bundle, else the system's;
    ``cert``/``key`` a client certificate for brokers that require one, see
    :mod:`edgefl.transport.tls`).
    """

    host: str = "127.0.0.1"
    port: int = 1883
    username: str | None = None
    password: str | None = None
    tls: bool = False
    ca_file: str | None = None
    insecure: bool = False
    protocol: str = "auto"
    cert_file: str | None = None
    key_file: str | None = None

    @classmethod
    def parse(cls, url: str) -> BrokerAddress:
        u = urlparse(url if "://" in url else f"mqtt://{url}")
        if u.scheme not in ("mqtt", "mqtts", "tcp", "ssl"):
            raise ConfigError(f"broker URL {url!r}: scheme must be mqtt:// or mqtts://")
        tls = u.scheme in ("mqtts", "ssl")
        q = {k: v[-1] for k, v in parse_qs(u.query).items()}
        protocol = q.get("protocol", "auto")
        if protocol not in ("auto", "5", "3.1.1"):
            raise ConfigError(f"broker URL {url!r}: protocol must be 5, 3.1.1 or auto")
        try:
            port = u.port or (8883 if tls else 1883)
        except ValueError:
            raise ConfigError(f"broker URL {url!r} has an invalid port") from None
        return cls(
            host=u.hostname or "127.0.0.1",
            port=port,
            username=unquote(u.username) if u.username else None,
            password=unquote(u.password) if u.password else None,
            tls=tls,
            ca_file=q.get("ca"),
            insecure=q.get("insecure", "0") in ("1", "true", "yes"),
            protocol=protocol,
            cert_file=q.get("cert"),
            key_file=q.get("key"),
        )

    def with_credentials(self, username: str | None, password: str | None) -> BrokerAddress:
        return dataclasses.replace(self, username=username or self.username, password=password or self.password)

    def with_tls(self, ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None) -> BrokerAddress:
        """Certificate files given apart from the URL (options, environment) win over its query."""
        return dataclasses.replace(
            self, ca_file=ca_file or self.ca_file, cert_file=cert_file or self.cert_file, key_file=key_file or self.key_file
        )

    def __str__(self) -> str:
        user = f"{self.username}@" if self.username else ""
        return f"{'mqtts' if self.tls else 'mqtt'}://{user}{self.host}:{self.port}"


class Topics:
    def __init__(self, fleet: str):
        if not fleet or any(c in fleet for c in "+#/"):
            raise ConfigError(f"fleet name {fleet!r} must be non-empty without '+', '#' or '/'")
        self.fleet = fleet
        self.root = f"edgefl/{fleet}"
        self.broadcast = f"{self.root}/broadcast"
        self.server_status = f"{self.root}/server/status"
        self.fleet_status = f"{self.root}/server/fleet"  # retained; the server and operators read it

    def device(self, device_id: str, leaf: str) -> str:
        return f"{self.root}/devices/{device_id}/{leaf}"

    def parse_device(self, topic: str) -> tuple[str, str] | None:
        """(device id, leaf) of a per-device topic of this fleet, else None."""
        parts = topic.split("/")
        if len(parts) == 5 and parts[:3] == ["edgefl", self.fleet, "devices"]:
            return parts[3], parts[4]
        return None


# --- protocol detection and the shared client wrapper -------------------------------------------

_PROTOCOL_CACHE: dict[tuple[str, int], int] = {}


def _configure(client: mqtt.Client, address: BrokerAddress) -> None:
    if address.username:
        client.username_pw_set(address.username, address.password)
    if address.tls:
        if bool(address.cert_file) != bool(address.key_file):
            raise ConfigError("a client certificate needs both its certificate and its key file")
        try:
            client.tls_set(ca_certs=address.ca_file, certfile=address.cert_file, keyfile=address.key_file, cert_reqs=ssl.CERT_REQUIRED)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"cannot load the TLS files for {address}: {e}") from None
        if address.insecure:
            client.tls_insecure_set(True)


def detect_protocol(address: BrokerAddress, timeout: float = 10.0) -> int:
    """MQTT 5 when the broker accepts it (Mosquitto), else 3.1.1 (amqtt)."""
    if address.protocol == "5":
        return mqtt.MQTTv5
    if address.protocol == "3.1.1":
        return mqtt.MQTTv311
    key = (address.host, address.port)
    if key in _PROTOCOL_CACHE:
        return _PROTOCOL_CACHE[key]
    result: dict[str, object] = {}
    done = threading.Event()
    probe = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"edgefl-probe-{uuid.uuid4().hex[:12]}", protocol=mqtt.MQTTv5)
    _configure(probe, address)

    def on_connect(client, userdata, flags, reason, properties):
        result["reason"] = reason
        done.set()

    def on_disconnect(client, userdata, flags, reason, properties):
        result.setdefault("reason", reason)
        done.set()

    probe.on_connect, probe.on_disconnect = on_connect, on_disconnect
    deadline = time.monotonic() + timeout
    while True:
        try:
            probe.connect(address.host, address.port, keepalive=10)
            break
        except (OSError, ssl.SSLError) as e:
            if time.monotonic() > deadline:
                raise TransportError(f"cannot reach the broker at {address}: {e}") from None
            time.sleep(0.5)
    probe.loop_start()
    done.wait(timeout)
    probe.loop_stop()
    try:
        probe.disconnect()
    except Exception:  # noqa: S110 - the probe is thrown away
        pass
    reason = result.get("reason")
    if reason is not None and getattr(reason, "value", 1) == 0:
        proto = mqtt.MQTTv5
    elif reason is not None and getattr(reason, "value", 0) in (0x86, 0x87, 0x8C):  # bad credentials/auth
        raise AuthenticationError(f"the broker at {address} refused the connection: {reason}")
    else:
        proto = mqtt.MQTTv311
    _PROTOCOL_CACHE[key] = proto
    return proto


class Endpoint:
    """One paho client with a stable id, persistent session, Last Will and auto-reconnect."""

    def __init__(
        self,
        address: BrokerAddress,
        client_id: str,
        topics: Topics,
        *,
        limits: Limits = Limits(),
        will: tuple[str, bytes] | None = None,
        reconnect_max: float = 8.0,
        chunks: ChunkSettings | None = None,
    ):
        self.address, self.client_id, self.topics, self.limits = address, client_id, topics, limits
        # envelopes above chunks.threshold travel in chunks (edgefl.transport.chunks)
        self.chunks = chunks or ChunkSettings.from_env()
        self.chunker = ChunkSender(self._publish_chunk, self.chunks, name=f"{client_id}-chunks")
        self.reassembly = Reassembler(self.chunks, max_bytes=limits.max_bytes)
        self.protocol = detect_protocol(address)
        self.connected = threading.Event()
        self.refused: str | None = None
        self.bytes_published = 0
        kwargs = {"clean_session": False} if self.protocol == mqtt.MQTTv311 else {}
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=self.protocol, **kwargs)
        _configure(self.client, address)
        self.client.max_inflight_messages_set(100)
        self.client.reconnect_delay_set(min_delay=1, max_delay=int(reconnect_max))
        if will is not None:
            self.client.will_set(will[0], will[1], qos=1, retain=True)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_message = self._on_message_safe

    # subclasses: subscriptions, what to publish on (re)connect, and message handling
    def subscriptions(self) -> list[str]:
        return []

    def on_connected(self) -> None:
        pass

    def on_message(self, topic: str, data: bytes) -> None:
        pass

    def on_chunked_sent(self, topic: str, message_id: str, ok: bool) -> None:
        """A chunked message was acknowledged whole by its receiver (``ok``), or refused/given up."""

    def on_chunk_rejected(self, topic: str, reason: str) -> None:
        """A chunk (or chunk ack) on ``topic`` was refused."""

    def start(self, wait: float | None = 30.0) -> Endpoint:
        props = None
        if self.protocol == mqtt.MQTTv5:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = SESSION_EXPIRY_SECONDS
        self.client.connect_async(
            self.address.host, self.address.port, keepalive=15, clean_start=False if props is not None else mqtt.MQTT_CLEAN_START_FIRST_ONLY, properties=props
        )
        self.client.loop_start()
        if wait and not self.connected.wait(wait):
            reason = self.refused or "no answer"
            self.stop(graceful=False)
            raise TransportError(f"{self.client_id} could not connect to the broker at {self.address}: {reason}")
        return self

    def stop(self, graceful: bool = True) -> None:
        self.chunker.stop()
        try:
            if graceful:
                self.client.disconnect()
        finally:
            self.client.loop_stop()

    def publish(self, topic: str, data: bytes, *, retain: bool = False, qos: int = 1) -> None:
        if len(data) > self.limits.max_bytes:
            raise WireError(f"refusing to publish {len(data)} bytes: the limit is {self.limits.max_bytes}")
        if len(data) > self.chunks.threshold and not retain and _reverse(topic) is not None:
            message_id = peek(data, self.limits).message_id
            self.chunker.send(topic, data, bytes.fromhex(message_id), on_done=lambda ok: self.on_chunked_sent(topic, message_id, ok))
            self.bytes_published += len(data)
            return
        info = self.client.publish(topic, data, qos=qos, retain=retain)
        self.bytes_published += len(data)
        if info.rc not in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN):
            log.warning("%s: publishing to %s failed: %s", self.client_id, topic, mqtt.error_string(info.rc))

    def _on_connect(self, client, userdata, flags, reason, properties):
        if reason.is_failure:
            self.refused = str(reason)
            log.warning("%s: the broker refused the connection: %s", self.client_id, reason)
            return
        _no_delay(client)
        for topic in self.subscriptions():
            client.subscribe(topic, qos=1)
        self.on_connected()
        self.connected.set()
        log.debug("%s connected (session present: %s)", self.client_id, flags.session_present)

    def _on_disconnect(self, client, userdata, flags, reason, properties):
        self.connected.clear()
        if reason.is_failure or str(reason) != "Normal disconnection":
            log.info("%s disconnected (%s); reconnecting", self.client_id, reason)

    def _publish_chunk(self, topic: str, data: bytes) -> None:
        info = self.client.publish(topic, data, qos=1)
        if info.rc not in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN):
            log.warning("%s: publishing a chunk to %s failed: %s", self.client_id, topic, mqtt.error_string(info.rc))

    def _on_chunk(self, topic: str, data: bytes) -> None:
        """A chunk or a chunk ack: its answer goes back on the reverse topic (up ↔ down); a whole
        message goes on to :meth:`on_message`, as if it had come in one piece."""
        back = _reverse(topic)
        try:
            if back is None:
                raise WireError("a chunk on a topic that carries none")
            if is_ack(data):
                self.chunker.on_ack(back, data)
                return
            try:
                message, ack = self.reassembly.add(topic, data)
            except ChunkRefused as e:
                self.client.publish(back, e.ack, qos=0)
                raise
        except WireError as e:
            self.on_chunk_rejected(topic, str(e))
            raise
        self.client.publish(back, ack, qos=0)  # an ack: a lost one is covered by the next, or a stall
        if message is not None:
            self.on_message(topic, message)

    def _on_message_safe(self, client, userdata, msg):
        try:
            if is_chunk(msg.payload) or is_ack(msg.payload):
                self._on_chunk(msg.topic, msg.payload)
                return
            if len(msg.payload) > self.limits.max_bytes:
                raise WireError(f"message of {len(msg.payload)} bytes exceeds the limit of {self.limits.max_bytes}")
            self.on_message(msg.topic, msg.payload)
        except WireError as e:
            log.warning("%s: rejected a message on %s: %s", self.client_id, msg.topic, e)
        except Exception:  # a bug in a handler must not kill the network thread
            log.exception("%s: failed to handle a message on %s", self.client_id, msg.topic)


def _no_delay(client: mqtt.Client) -> None:
    """Turn Nagle's algorithm off: edgefl's exchanges are request/response, and Nagle's
    wait for the peer's delayed ACK added ~150 ms per round (benchmarks/overhead)."""
    sock = client.socket()
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except (AttributeError, OSError) as e:  # a websocket or an exotic transport
        log.debug("could not set TCP_NODELAY: %s", e)


def _reverse(topic: str) -> str | None:
    """The topic answering ``topic``'s chunks: a device's uplink for its downlink and back."""
    head, _, leaf = topic.rpartition("/")
    return {"up": f"{head}/down", "down": f"{head}/up"}.get(leaf) if head else None


def retry_delay(base: float, nbytes: int) -> float:
    """First re-send delay for a message of ``nbytes``: the base plus the time a slow link
    (2 MB/s) needs to carry it, so large envelopes still queued at the broker are not re-sent
    in a storm."""
    return base + nbytes / 2e6


def ack_envelope(fleet: str, device_id: str, routing: Routing) -> bytes:
    return encode(Envelope("ack", routing.round, device_id, fleet=fleet, payload=Payload({}, {"ack": routing.message_id})))


# --- the server side ------------------------------------------------------------------------------


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


@dataclass
class ExchangeStats:
    """Bytes actually published per device (retries included) and retries, since the last take()."""

    bytes_down: dict[str, int] = field(default_factory=dict)
    bytes_up: dict[str, int] = field(default_factory=dict)
    retries: dict[str, int] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    rejected: dict[str, int] = field(default_factory=dict)  # messages refused, per sender


RegisterHandler = Callable[[str, bytes], bytes | None]


class MqttServerTransport(Endpoint):
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
    ):
        topics = Topics(fleet)
        self.epoch = epoch or uuid.uuid4().hex[:12]
        will = json.dumps({"state": "offline", "epoch": self.epoch}).encode()
        super().__init__(address, f"edgefl-{fleet}-server", topics, limits=limits, will=(topics.server_status, will), chunks=chunks)
        self.fleet = fleet
        self.on_register = on_register
        self.retry_after, self.retry_max = retry_after, retry_max
        self.ack_delay = max(0.0, min(ack_delay, retry_after / 4))  # devices re-send after retry_after
        self.lock = threading.Condition()
        # the request loop sleeps until wake_at unless woken: by the last reply, or by a reply
        # whose lone acknowledgement would fall due before wake_at (one wake-up, not one per reply)
        self.outstanding = 0
        self.wake_at = 0.0
        self.pending: dict[str, _Pending] = {}
        self.seen_replies: OrderedDict[str, None] = OrderedDict()
        self.status: dict[str, str] = {}
        self.last_seen: dict[str, float] = {}  # device → wall-clock time of its last message
        self.stats = ExchangeStats()

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
    def request(self, messages: Mapping[str, bytes], *, timeout: float | None, accept: Accept) -> dict[str, Delivery]:
        now = time.monotonic()
        deadline = None if timeout is None else now + timeout
        out: dict[str, Delivery] = {}
        with self.lock:
            for device_id, data in messages.items():
                try:
                    r = peek(data, self.limits)
                except WireError as e:  # e.g. larger than the limit: never published
                    out[device_id] = Delivery(device_id, None, f"not sent: {e}")
                    continue
                first = retry_delay(self.retry_after, len(data))
                self.pending[device_id] = _Pending(r.message_id, r.round, r.kind, data, now, now + first, first, accept=accept)
            self.outstanding = sum(1 for d in messages if d in self.pending)
            self.wake_at = now
        for device_id, data in messages.items():
            if device_id not in out:
                self._send(device_id, data)
        while True:
            resend, acks = [], []
            with self.lock:
                mine = [self.pending[d] for d in messages if d in self.pending]
                waiting = [d for d in messages if d in self.pending and self.pending[d].reply is None]
                now = time.monotonic()
                if not waiting or (deadline is not None and now >= deadline):
                    break
                for d in waiting:
                    p = self.pending[d]
                    if not p.acked and now >= p.next_retry and self.chunker.active(self.topics.device(d, "down"), bytes.fromhex(p.message_id)):
                        p.next_retry = now + p.retry_every  # in chunks: re-sent by their progress, not by this clock
                    if not p.acked and now >= p.next_retry:
                        p.retry_every = min(self.retry_max, p.retry_every * 2)
                        p.next_retry = now + p.retry_every
                        p.attempts += 1
                        self.stats.retries[d] = self.stats.retries.get(d, 0) + 1
                        resend.append((d, p))
                for p in mine:
                    if p.reply is not None and not p.reply_acked and now >= p.replied_at + self.ack_delay:
                        p.reply_acked = True  # the exchange goes on: acknowledge it alone
                        acks.append(p)
                if not resend and not acks:
                    wake = min(self.pending[d].next_retry for d in waiting)
                    unacked = [p.replied_at + self.ack_delay for p in mine if p.reply is not None and not p.reply_acked]
                    wake = min([wake, *unacked])
                    if deadline is not None:
                        wake = min(wake, deadline)
                    pause = max(0.001, min(1.0, wake - now))
                    self.wake_at = now + pause
                    self.lock.wait(pause)
            # publish outside the lock: paho's network thread takes it in on_message
            for d, p in resend:
                log.info("no acknowledgement from %s for %s round %d; re-sending", d, p.kind, p.round)
                self._send(d, p.data)
            for p in acks:
                self._ack_reply(p.reply_routing)
        closed: set[tuple[str, int]] = set()
        with self.lock:
            for device_id in messages:
                if device_id in out:
                    continue
                p = self.pending.pop(device_id, None)
                if p is not None:
                    closed.add((p.kind, p.round))
                rejected = tuple(p.rejected) if p is not None else ()
                if p is not None and p.reply is not None:
                    out[device_id] = Delivery(device_id, p.reply, None, p.replied_at - p.sent, p.value, rejected)
                else:
                    state = self.status.get(device_id, "unknown")
                    why = "no acknowledgement" if p is None or not p.acked else "acknowledged but no reply"
                    out[device_id] = Delivery(device_id, None, f"deadline of {timeout:g} s passed ({why}; device {state})", time.monotonic() - (p.sent if p else now), rejected=rejected)
        for kind, rnd in sorted(closed):
            self._announce_closed(kind, rnd)
        return out

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
        self.publish(self.topics.device(r.device_id, "down"), ack_envelope(self.fleet, r.device_id, r), qos=0)

    def _announce_closed(self, kind: str, rnd: int) -> None:
        """One broadcast acknowledging every reply to the (kind, round) exchange, which is over."""
        env = Envelope("ack", rnd, "*", fleet=self.fleet, payload=Payload({}, {"closed": kind, "epoch": self.epoch}))
        self.publish(self.topics.broadcast, encode(env), qos=0)  # an ack: a lost one costs a re-send

    def close(self) -> None:
        self.stop()

    def announce_end(self) -> None:
        """Tell every device (retained, so also those reconnecting later) that the run is over."""
        env = Envelope("finish", 0, "*", fleet=self.fleet, payload=Payload({}, {"run_over": True, "epoch": self.epoch}))
        info = self.client.publish(self.topics.broadcast, encode(env), qos=1, retain=True)
        try:
            info.wait_for_publish(5)
        except (RuntimeError, ValueError):
            pass

    def _send(self, device_id: str, data: bytes) -> None:
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
            with self.lock:
                self.status[device_id] = data.decode("utf-8", "replace")[:32] or "unknown"
            return
        try:
            r = peek(data, self.limits)
            if r.device_id != device_id:
                raise WireError(f"envelope names device {r.device_id!r} but came on {device_id!r}'s topic")
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
                    p.acked = True  # the request loop sees it before its next re-send falls due
            return
        if r.kind not in ("update", "metrics", "done", "error"):
            self._count_rejected(device_id, f"a {r.kind!r} on the uplink")
            raise WireError(f"a device does not send {r.kind!r} messages")
        with self.lock:
            self.stats.bytes_up[device_id] = self.stats.bytes_up.get(device_id, 0) + len(data)
            duplicate = r.message_id in self.seen_replies
            p = self.pending.get(device_id)
            candidate = not duplicate and p is not None and p.reply is None and r.round == p.round and r.kind in (REPLY_KINDS.get(p.kind), "error")
            if candidate:
                self._seen(r.message_id)
        if candidate:
            # decode and check outside the lock (a large update takes tens of ms); the first
            # accepted reply wins, a refused one is counted and never takes the real one's place
            try:
                value = p.accept(device_id, bytes(data)) if p.accept is not None else None
            except WireError as e:
                log.warning("refused a %s from %s for round %d: %s", r.kind, device_id, r.round, e)
                self._count_rejected(device_id, str(e))
                self._ack_reply(r)  # its sender may stop re-sending it: it will never be accepted
                return
            with self.lock:
                if self.pending.get(device_id) is p and p.reply is None:
                    p.reply, p.replied_at, p.acked, p.reply_routing, p.value = bytes(data), time.monotonic(), True, r, value
                    self.outstanding -= 1
                    if self.outstanding <= 0 or p.replied_at + self.ack_delay < self.wake_at:
                        self.lock.notify_all()
                    return  # acknowledged by the exchange's closing broadcast, or alone after ack_delay
        with self.lock:
            if not duplicate and not candidate:
                self.stats.dropped.append(f"{device_id}:{r.kind}:{r.round}")
                log.warning("dropped a late or unsolicited %s from %s for round %d", r.kind, device_id, r.round)
        # acknowledge a duplicate or a late reply at once: the device stops re-sending it
        self._ack_reply(r)


# --- the device side ------------------------------------------------------------------------------


@dataclass
class _Unacked:
    topic: str
    data: bytes
    next_retry: float
    retry_every: float
    attempts: int = 0
    request: tuple[str, int] = ("", -1)  # (kind, round) of the request it answers


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
        super().__init__(
            address,
            client_id or f"edgefl-{fleet}-{device_id}",
            topics,
            limits=limits,
            will=(topics.device(device_id, "status"), b"offline") if will else None,
            chunks=chunks,
        )
        self.fleet, self.device_id = fleet, device_id
        self.announce = will
        self.inbox: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.handled: OrderedDict[str, bytes | None] = OrderedDict()  # request id → reply (None: in progress)
        self.unacked: dict[str, _Unacked] = {}
        self.retry_after, self.retry_max, self.max_attempts = retry_after, retry_max, max_attempts
        # the server re-sends an unacknowledged request after retry_after: acknowledge well before
        self.ack_delay = max(0.0, min(ack_delay, retry_after / 4))
        self.acks_due: OrderedDict[str, tuple[float, Routing]] = OrderedDict()  # request id → (due, routing)
        self.acks_wake = threading.Condition(self.lock)
        self.acker: threading.Thread | None = None
        self.stopping = False

    def subscriptions(self) -> list[str]:
        return [self.topics.device(self.device_id, "down"), self.topics.broadcast, self.topics.server_status]

    def on_connected(self) -> None:
        if self.announce:  # a helper connection (registration check) does not announce liveness
            self.client.publish(self.topics.device(self.device_id, "status"), b"online", qos=1, retain=True)

    def start(self, wait: float | None = 30.0) -> MqttDeviceEndpoint:
        if self.ack_delay > 0 and self.acker is None:
            self.acker = threading.Thread(target=self._ack_when_due, name=f"{self.client_id}-acks", daemon=True)
            self.acker.start()
        super().start(wait)
        return self

    def stop(self, graceful: bool = True) -> None:
        with self.lock:
            self.stopping = True
            self.acks_due.clear()
            self.acks_wake.notify_all()
        if graceful and self.connected.is_set() and self.announce:
            info = self.client.publish(self.topics.device(self.device_id, "status"), b"offline", qos=1, retain=True)
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
        with self.lock:  # no notify: the idle acker looks every ack_delay (a wake-up saved per request)
            self.acks_due[request.message_id] = (time.monotonic() + self.ack_delay, request)

    def _ack(self, request: Routing) -> None:
        self.publish(self.topics.device(self.device_id, "up"), ack_envelope(self.fleet, self.device_id, request), qos=0)

    def _ack_when_due(self) -> None:
        """The acker thread: one per endpoint (a thread per request costs a thread start, ~1 ms
        on a busy 2-core device). Entries are due in arrival order (one constant delay); an ack
        goes out between ack_delay and 2·ack_delay after its request, far below retry_after."""
        while True:
            with self.lock:
                while not self.stopping and (not self.acks_due or next(iter(self.acks_due.values()))[0] > time.monotonic()):
                    timeout = next(iter(self.acks_due.values()))[0] - time.monotonic() if self.acks_due else self.ack_delay
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
            self.unacked[reply_id] = _Unacked(topic, data, time.monotonic() + first, first, request=(request.kind, request.round))
        self.publish(topic, data)

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
                    u.next_retry = now + u.retry_every  # in chunks: re-sent by their progress, not by this clock
                elif now >= u.next_retry:
                    due.append((key, u))
            for key, u in due:
                u.attempts += 1
                if u.attempts > self.max_attempts:
                    log.warning("device %s: giving up on a reply after %d attempts", self.device_id, u.attempts - 1)
                    del self.unacked[key]
                    continue
                u.retry_every = min(self.retry_max, u.retry_every * 2)
                u.next_retry = now + u.retry_every
        for key, u in due:
            if key in self.unacked:
                log.info("device %s: no acknowledgement for a reply; re-sending", self.device_id)
                self.publish(u.topic, u.data)
