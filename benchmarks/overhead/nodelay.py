"""TCP_NODELAY for paho clients (and Mosquitto's ``set_tcp_nodelay``): the benchmark's variant.

Neither paho-mqtt nor Mosquitto (by default) disable Nagle's algorithm. edgefl's exchanges are
request → ack + reply: a small write right after another small write waits for the peer's
delayed ACK (~40 ms on Linux) unless TCP_NODELAY is set. The benchmark measures edgefl as
shipped and, as a separate row, with this patch applied to every process of the run.
"""

from __future__ import annotations

import socket

_ORIGINAL = None


def enable() -> None:
    global _ORIGINAL
    import paho.mqtt.client as mqtt

    original = mqtt.Client._create_socket_connection
    if getattr(original, "_nodelay", False):
        return
    _ORIGINAL = original

    def create(self):
        sock = original(self)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        return sock

    create._nodelay = True
    mqtt.Client._create_socket_connection = create


def disable() -> None:
    global _ORIGINAL
    import paho.mqtt.client as mqtt

    if _ORIGINAL is not None:
        mqtt.Client._create_socket_connection = _ORIGINAL
        _ORIGINAL = None


def mosquitto_nodelay(broker) -> None:
    """Make a (not yet started) MosquittoBroker write ``set_tcp_nodelay true`` into its config."""
    text = broker.config_text()
    broker.config_text = lambda: text + "set_tcp_nodelay true\n"
