"""MQTT transport (paho-mqtt 2.x): the server's :class:`Transport` and the device's endpoint.

Topics, all under ``edgefl/<fleet>/``::

    devices/<id>/down       server → device   train / evaluate / finish / assign / ack envelopes
    devices/<id>/up         device → server   update / metrics / done / error / ack envelopes
    devices/<id>/register   device → server   register envelopes (profile, readiness)
    devices/<id>/status     device, retained  "online <session>" / "offline <session>" (the
                                              Last Will; the session: 16 hex digits, new for
                                              each device process)
    server/status           server, retained  {"state": "online"|"offline", "epoch": ...}
                                              (Last Will)
    broadcast               server, retained  the end of a run (a "finish" envelope for device "*")
    server/fleet            server, retained  fleet status JSON (edgefl.runtime.status)
    devices/<id>/model      operator/server, retained  model rollout commands (edgefl.rollout)
    devices/<id>/active     device, retained  the device's active model version (edgefl.rollout)
    devices/<id>/agent      device, retained  its model agent's "online/offline <session>"
                                              (Last Will; edgefl.rollout)

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
  A new request to a device says the same of every reply that device sent before (the server
  keeps one request open per device), so the broadcast waits ``ack_delay`` for the next requests
  and is not sent when every device of the exchange got one by then
  (:mod:`~edgefl.transport.mqtt.closing`): in a run of quick rounds only the last exchange is
  announced. Replies that wait longer, duplicates and late replies are acknowledged one by one;
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

The modules, along the seams: :mod:`~edgefl.transport.mqtt.topics` (the names above),
:mod:`~edgefl.transport.mqtt.connection` (addresses, protocol detection, the client wrapper and
its session), :mod:`~edgefl.transport.mqtt.reliable` (what both sides of the request/ack protocol
share), :mod:`~edgefl.transport.mqtt.server` and :mod:`~edgefl.transport.mqtt.device` (each side),
:mod:`~edgefl.transport.mqtt.closing` (the server's closing broadcasts).
"""

from edgefl.transport.mqtt.connection import (
    SESSION_EXPIRY_SECONDS,
    BrokerAddress,
    Endpoint,
    detect_protocol,
)
from edgefl.transport.mqtt.device import MqttDeviceEndpoint
from edgefl.transport.mqtt.reliable import ack_envelope, retry_delay
from edgefl.transport.mqtt.server import ExchangeStats, MqttServerTransport, RegisterHandler
from edgefl.transport.mqtt.topics import Topics

__all__ = [
    "SESSION_EXPIRY_SECONDS",
    "BrokerAddress",
    "Endpoint",
    "ExchangeStats",
    "MqttDeviceEndpoint",
    "MqttServerTransport",
    "RegisterHandler",
    "Topics",
    "ack_envelope",
    "detect_protocol",
    "retry_delay",
]
