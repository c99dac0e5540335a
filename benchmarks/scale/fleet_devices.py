"""Many lightweight devices in one process, on one thread:
``python -m benchmarks.scale.fleet_devices SPEC.json``.

SPEC.json is a list of :class:`edgefl.runtime.device.DeviceOptions` fields. Each device is a real
:class:`~edgefl.runtime.device.DeviceRuntime` (its registration, assignment, agent, request
checks, replies, acknowledgements and de-duplication), but instead of the three threads a
device runs alone (paho's network loop, the acknowledger, the serving loop), one thread drives
every device's paho client through one ``selectors`` loop (paho's external-loop API) and serves
their inboxes in turn. A thousand devices then cost the broker a thousand connections and this
machine ten processes, not three thousand threads.
"""

import json
import logging
import queue
import selectors
import sys
import time
from pathlib import Path

import torch

import benchmarks.overhead.echo  # noqa: F401  (registers bench-echo)
from edgefl.runtime.device import DeviceOptions, DeviceRuntime

log = logging.getLogger("fleet_devices")


# one thread serves a process's devices in turn, and building a device's model on a loaded
# machine can hold it for a while: the broker must not drop the others meanwhile
KEEPALIVE = 900


def connect(rt: DeviceRuntime) -> None:
    ep = rt.endpoint
    ep.client.connect(ep.address.host, ep.address.port, **ep.connect_options(KEEPALIVE))


def serve_inbox(rt: DeviceRuntime) -> bool:
    """What DeviceRuntime.run does with each inbox item, without blocking; whether there was any."""
    worked = False
    while True:
        try:
            kind, routing, item = rt.endpoint.inbox.get_nowait()
        except queue.Empty:
            return worked
        rt.handle(kind, routing, item)
        worked = True


def pump(sel: selectors.BaseSelector, timeout: float) -> None:
    """Read what the sockets hold (requests, acknowledgements: a device acknowledges a request as
    it reads it) and write what is queued, for every device of this process."""
    for key, events in sel.select(timeout=timeout):
        client = key.data.endpoint.client
        if events & selectors.EVENT_READ:
            client.loop_read(max_packets=10)
        if client.want_write():
            client.loop_write()


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(1)
    specs = json.loads(Path(sys.argv[1]).read_text())
    runtimes = [DeviceRuntime(DeviceOptions(**s)) for s in specs]
    sel = selectors.DefaultSelector()
    for rt in runtimes:
        connect(rt)
        sel.register(rt.endpoint.client.socket(), selectors.EVENT_READ, rt)
    next_misc = 0.0
    while not all(rt.over for rt in runtimes):
        pump(sel, 0.05)
        now = time.monotonic()
        for rt in runtimes:
            client = rt.endpoint.client
            sock = client.socket()
            if sock is None:  # dropped: paho's external loop does not reconnect by itself
                try:
                    client.reconnect()
                    log.warning("device %s reconnected", rt.opts.device_id)
                except OSError:
                    pass
                continue
            want = selectors.EVENT_READ | (selectors.EVENT_WRITE if client.want_write() else 0)
            try:
                if sel.get_key(sock).events != want:
                    sel.modify(sock, want, rt)
            except KeyError:  # a new socket (paho reconnected)
                sel.register(sock, want, rt)
            rt.register_if_due()
            if serve_inbox(rt):
                pump(sel, 0)  # the other devices' requests do not wait for this whole pass
            if client.want_write():
                client.loop_write()
        if now >= next_misc:  # keepalive pings and the endpoints' own re-sends, once a second
            for rt in runtimes:
                rt.endpoint.client.loop_misc()
                rt.endpoint.retry_unacked()
            next_misc = now + 1.0
    end = time.monotonic() + 5.0  # let the last replies and acknowledgements go out
    while time.monotonic() < end and any(rt.endpoint.client.want_write() for rt in runtimes):
        for rt in runtimes:
            if rt.endpoint.client.want_write():
                rt.endpoint.client.loop_write()
        time.sleep(0.01)
    for rt in runtimes:
        rt.endpoint.client.disconnect()


if __name__ == "__main__":
    main()
