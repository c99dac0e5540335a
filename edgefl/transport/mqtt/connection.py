"""Connection and session: broker addresses (``mqtt[s]://user:pass@host:port?ca=…``), protocol
detection (MQTT 5 where the broker speaks it, else 3.1.1), and :class:`Endpoint`, the one paho
client wrapper both sides use: a stable client id, a persistent session, a Last Will,
subscriptions made on every (re)connect, chunked transfer of large envelopes, and size checks
before any handler sees a message."""

from __future__ import annotations

import dataclasses
import logging
import socket
import ssl
import threading
import time
import uuid
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlparse

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edgefl.errors import (
    AuthenticationError,
    BrokerUnreachableError,
    ConfigError,
    TransportError,
    WireError,
)
from edgefl.transport.chunks import (
    ChunkRefused,
    ChunkSender,
    ChunkSettings,
    Reassembler,
    is_ack,
    is_chunk,
)
from edgefl.transport.mqtt.topics import Topics, _reverse
from edgefl.wire import Limits
from edgefl.wire.validate import peek

log = logging.getLogger(__name__)

SESSION_EXPIRY_SECONDS = 24 * 3600


@dataclass(frozen=True)
class BrokerAddress:
    """``mqtt://[user[:password]@]host[:port]``
    ``[?protocol=5|3.1.1|auto&ca=FILE&cert=FILE&key=FILE&insecure=1]``.

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
        return dataclasses.replace(
            self, username=username or self.username, password=password or self.password
        )

    def with_tls(
        self, ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None
    ) -> BrokerAddress:
        """Certificate files given apart from the URL (options, environment) win over its query."""
        return dataclasses.replace(
            self,
            ca_file=ca_file or self.ca_file,
            cert_file=cert_file or self.cert_file,
            key_file=key_file or self.key_file,
        )

    def __str__(self) -> str:
        user = f"{self.username}@" if self.username else ""
        return f"{'mqtts' if self.tls else 'mqtt'}://{user}{self.host}:{self.port}"

_PROTOCOL_CACHE: dict[tuple[str, int], int] = {}


def _configure(client: mqtt.Client, address: BrokerAddress) -> None:
    if address.username:
        client.username_pw_set(address.username, address.password)
    if address.tls:
        if bool(address.cert_file) != bool(address.key_file):
            raise ConfigError("a client certificate needs both its certificate and its key file")
        try:
            client.tls_set(
                ca_certs=address.ca_file,
                certfile=address.cert_file,
                keyfile=address.key_file,
                cert_reqs=ssl.CERT_REQUIRED,
            )
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"cannot load the TLS files for {address}: {e}") from None
        if address.insecure:
            client.tls_insecure_set(True)


#: TLS alerts by which a broker refuses the client's certificate (or the lack of one).
_REFUSED_CERT_ALERTS = (
    "CERTIFICATE_REQUIRED", "HANDSHAKE_FAILURE", "BAD_CERTIFICATE", "UNKNOWN_CA",
    "CERTIFICATE_UNKNOWN", "DECRYPT_ERROR", "ACCESS_DENIED", "UNSUPPORTED_CERTIFICATE",
)  # fmt: skip


def check_tls(address: BrokerAddress, timeout: float = 10.0) -> None:
    """Shake hands with a TLS broker once, before MQTT, and turn a refusal into one clear error
    instead of a client that reconnects silently forever:

    - the broker's certificate cannot be verified: :class:`ConfigError` naming ``--ca-file``
      (or, for a certificate issued for another host, the host names it holds);
    - the broker refuses this client's certificate, or the lack of one:
      :class:`AuthenticationError` naming ``--cert-file``/``--key-file``.

    A broker that cannot be reached is left to the caller's retries. Under TLS 1.3 the broker
    judges the client's certificate after the handshake, so its verdict is read: a refusal is an
    alert, an acceptance its session tickets (or silence, up to a second)."""
    if not address.tls:
        return
    if bool(address.cert_file) != bool(address.key_file):
        raise ConfigError(
            "a client certificate needs both its certificate and its key file (--cert-file and "
            "--key-file)"
        )
    try:
        context = ssl.create_default_context(cafile=address.ca_file or None)
        if address.cert_file:
            context.load_cert_chain(address.cert_file, address.key_file)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(
            f"cannot load the TLS files for {address} (--ca-file, --cert-file, --key-file): {e}"
        ) from None
    if address.insecure:
        context.check_hostname = False
    try:
        raw = socket.create_connection((address.host, address.port), timeout=timeout)
    except OSError:
        return  # unreachable: the caller retries, or reports it
    try:
        with context.wrap_socket(raw, server_hostname=address.host) as tls:
            deadline = time.monotonic() + 1.0
            tls.settimeout(0.05)
            while time.monotonic() < deadline:
                try:
                    if not tls.recv(1):
                        return  # closed without a verdict: MQTT's own errors will tell
                except TimeoutError:
                    if tls.session is not None and tls.session.has_ticket:
                        break  # the broker issued a session ticket: it accepted this client
                    continue
                break
            try:  # leave with a TLS close_notify, so that the broker logs no "unexpected eof"
                tls.settimeout(1.0)
                tls.unwrap()
            except (OSError, ValueError):
                pass
    except ssl.SSLCertVerificationError as e:
        why = e.verify_message or e.reason or str(e)
        if e.verify_code in (
            62,
            64,
        ):  # X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH
            raise ConfigError(
                f"TLS: the broker's certificate is not valid for {address.host} ({why}): dial a "
                "host name or "
                "address it was issued for (edgefl broker ca --host/--ip)"
            ) from None
        given = f"; --ca-file {address.ca_file} did not sign it" if address.ca_file else ""
        raise ConfigError(
            f"TLS: cannot verify the broker's certificate at {address} ({why}){given}: give the "
            "fleet CA "
            "with --ca-file (or EDGEFL_CA_FILE, or ?ca=FILE in the broker URL)"
        ) from None
    except ssl.SSLError as e:
        reason = str(e.reason or e)
        if not any(alert in reason.upper() for alert in _REFUSED_CERT_ALERTS):
            raise ConfigError(
                f"TLS handshake with the broker at {address} failed: {reason}"
            ) from None
        if not address.cert_file:
            raise AuthenticationError(
                f"the broker at {address} requires a client certificate ({reason}): give "
                "--cert-file "
                "and --key-file (edgefl broker add-device NAME --fleet FLEET --certs DIR makes "
                "them)"
            ) from None
        raise AuthenticationError(
            f"the broker at {address} refused the client certificate --cert-file "
            f"{address.cert_file} "
            f"({reason}): it must be signed by the broker's fleet CA"
        ) from None
    except OSError:
        return  # reset or closed mid-handshake: left to the caller's retries
    finally:
        raw.close()


def detect_protocol(address: BrokerAddress, timeout: float = 10.0) -> int:
    """MQTT 5 when the broker accepts it (Mosquitto), else 3.1.1 (amqtt). A TLS broker's verdict
    on this client comes first (:func:`check_tls`)."""
    check_tls(address)
    if address.protocol == "5":
        return mqtt.MQTTv5
    if address.protocol == "3.1.1":
        return mqtt.MQTTv311
    key = (address.host, address.port)
    if key in _PROTOCOL_CACHE:
        return _PROTOCOL_CACHE[key]
    result: dict[str, object] = {}
    done = threading.Event()
    probe = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=f"edgefl-probe-{uuid.uuid4().hex[:12]}",
        protocol=mqtt.MQTTv5,
    )
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
                raise BrokerUnreachableError(f"cannot reach the broker at {address}: {e}") from None
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
    # bad credentials/auth
    elif reason is not None and getattr(reason, "value", 0) in (0x86, 0x87, 0x8C):
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
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=client_id, protocol=self.protocol, **kwargs
        )
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
        """A chunked message was acknowledged whole by its receiver (``ok``), or refused/given
        up."""

    def on_chunk_rejected(self, topic: str, reason: str) -> None:
        """A chunk (or chunk ack) on ``topic`` was refused."""

    def accept_retained(self, topic: str) -> bool:
        """Whether a message the broker kept (retained, delivered on subscribing) is read at all."""
        return True

    def connect_options(self, keepalive: int) -> dict:
        """paho's ``connect`` arguments besides the address: under MQTT 5 the session outlives a
        dropped connection (no clean start, :data:`SESSION_EXPIRY_SECONDS`)."""
        if self.protocol != mqtt.MQTTv5:
            return {"keepalive": keepalive}
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = SESSION_EXPIRY_SECONDS
        return {"keepalive": keepalive, "clean_start": False, "properties": props}

    def start(self, wait: float | None = 30.0) -> Endpoint:
        self.client.connect_async(self.address.host, self.address.port, **self.connect_options(15))
        self.client.loop_start()
        if wait and not self.connected.wait(wait):
            reason = self.refused or "no answer"
            self.stop(graceful=False)
            raise TransportError(
                f"{self.client_id} could not connect to the broker at {self.address}: {reason}"
            )
        return self

    def stop(self, graceful: bool = True) -> None:
        self.chunker.stop()
        self.reassembly.close()
        try:
            if graceful:
                self.client.disconnect()
        finally:
            self.client.loop_stop()

    def publish(
        self, topic: str, data: bytes, *, retain: bool = False, qos: int = 1
    ) -> mqtt.MQTTMessageInfo | None:
        """Publish ``data`` (in chunks above the threshold: then None is returned, else paho's
        MQTTMessageInfo, whose ``is_published()`` says when the broker has it)."""
        if len(data) > self.limits.max_bytes:
            raise WireError(
                f"refusing to publish {len(data)} bytes: the limit is {self.limits.max_bytes}"
            )
        if len(data) > self.chunks.threshold and not retain and _reverse(topic) is not None:
            message_id = peek(data, self.limits).message_id
            self.chunker.send(
                topic,
                data,
                bytes.fromhex(message_id),
                on_done=lambda ok: self.on_chunked_sent(topic, message_id, ok),
            )
            self.bytes_published += len(data)
            return
        info = self.client.publish(topic, data, qos=qos, retain=retain)
        self.bytes_published += len(data)
        if info.rc not in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN):
            log.warning(
                "%s: publishing to %s failed: %s", self.client_id, topic, mqtt.error_string(info.rc)
            )
        return info

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
            log.warning(
                "%s: publishing a chunk to %s failed: %s",
                self.client_id,
                topic,
                mqtt.error_string(info.rc),
            )

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
        # an ack: a lost one is covered by the next, or a stall
        self.client.publish(back, ack, qos=0)
        if message is not None:
            self.on_message(topic, message)

    def _on_message_safe(self, client, userdata, msg):
        try:
            if msg.retain and not self.accept_retained(msg.topic):
                return
            if is_chunk(msg.payload) or is_ack(msg.payload):
                self._on_chunk(msg.topic, msg.payload)
                return
            if len(msg.payload) > self.limits.max_bytes:
                raise WireError(
                    f"message of {len(msg.payload)} bytes exceeds the limit of "
                    f"{self.limits.max_bytes}"
                )
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
