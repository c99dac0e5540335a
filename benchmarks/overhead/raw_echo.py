"""Raw paho echo clients for ``chunked.py``: ``python raw_echo.py URL N``.

Client k subscribes to ``bench/echo/k/down`` and publishes every message it gets back on
``bench/echo/k/up`` (QoS 1). Prints ``ready`` once all N have subscribed; runs until killed.
"""

import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import paho.mqtt.client as mqtt  # noqa: E402

from edgefl.transport.mqtt import BrokerAddress  # noqa: E402


def main() -> None:
    addr = BrokerAddress.parse(sys.argv[1])
    n = int(sys.argv[2])
    subscribed = threading.Semaphore(0)
    clients = []
    for k in range(n):
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"bench-raw-echo-{k}", protocol=mqtt.MQTTv311)
        c.on_connect = lambda c, u, f, r, p, k=k: c.subscribe(f"bench/echo/{k}/down", qos=1)
        c.on_subscribe = lambda *a: subscribed.release()
        c.on_message = lambda c, u, m, k=k: c.publish(f"bench/echo/{k}/up", m.payload, qos=1)
        c.connect(addr.host, addr.port)
        c.loop_start()
        clients.append(c)
    for _ in range(n):
        subscribed.acquire(timeout=60)
    print("ready", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
