"""The raw paho floor of the overhead benchmark: echo devices and the server's round.

    python -m benchmarks.overhead.raw_echo URL PREFIX K [K ...]

runs one plain paho client per device number K (threads of one process, as the edgefl devices of
the benchmark share processes): client K subscribes to ``PREFIX/K/down`` and publishes every
message it gets back on ``PREFIX/K/up`` (QoS 1 both ways, TCP_NODELAY as edgefl's transport
sets it). It prints ``ready`` once every client has subscribed and runs until stopped.
:class:`RawServer` is the other side: one paho client that publishes a message to each of N
devices and waits for all N replies, which is an edgefl round's traffic with nothing else.
"""

from __future__ import annotations

import socket
import sys
import threading
import time

import paho.mqtt.client as mqtt

from edgefl.transport.mqtt import BrokerAddress


def client(client_id: str) -> mqtt.Client:
    return mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                       protocol=mqtt.MQTTv311)


def connect(c: mqtt.Client, url: str) -> None:
    addr = BrokerAddress.parse(url)
    c.connect(addr.host, addr.port)
    c.socket().setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    c.loop_start()


class RawServer:
    """One client publishing ``PREFIX/k/down`` to devices 0..n-1 and collecting ``PREFIX/k/up``."""

    def __init__(self, url: str, prefix: str, n: int, max_inflight: int | None = None):
        self.prefix, self.n = prefix, n
        self.lock = threading.Condition()
        self.replies: set[int] = set()
        self.subscribed = threading.Event()
        self.c = client(f"{prefix}-server")
        self.c.on_connect = lambda c, u, f, r, p: c.subscribe(f"{prefix}/+/up", qos=1)
        self.c.on_subscribe = lambda *a: self.subscribed.set()
        self.c.on_message = self._on_message
        if max_inflight is not None:
            self.c.max_inflight_messages_set(max_inflight)
        connect(self.c, url)
        if not self.subscribed.wait(60):
            raise RuntimeError("the raw server did not subscribe")

    def _on_message(self, c, userdata, msg) -> None:
        k = int(msg.topic.split("/")[-2])
        with self.lock:
            self.replies.add(k)
            if len(self.replies) >= self.n:
                self.lock.notify_all()

    def round(self, down: bytes, timeout: float = 600.0) -> float:
        """Seconds from the first publish to the last of the n replies."""
        with self.lock:
            self.replies.clear()
        t0 = time.perf_counter()
        for k in range(self.n):
            self.c.publish(f"{self.prefix}/{k}/down", down, qos=1)
        with self.lock:
            if not self.lock.wait_for(lambda: len(self.replies) >= self.n, timeout):
                raise RuntimeError(f"{len(self.replies)} of {self.n} raw replies in {timeout} s")
        return time.perf_counter() - t0

    def close(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


def main() -> None:
    url, prefix, ks = sys.argv[1], sys.argv[2], [int(k) for k in sys.argv[3:]]
    subscribed = threading.Semaphore(0)
    clients = []
    for k in ks:
        c = client(f"{prefix}-echo-{k}")
        c.on_connect = lambda c, u, f, r, p, k=k: c.subscribe(f"{prefix}/{k}/down", qos=1)
        c.on_subscribe = lambda *a: subscribed.release()
        c.on_message = lambda c, u, m, k=k: c.publish(f"{prefix}/{k}/up", m.payload, qos=1)
        connect(c, url)
        clients.append(c)
    for _ in ks:
        if not subscribed.acquire(timeout=120):
            raise SystemExit("raw echo clients did not subscribe")
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
