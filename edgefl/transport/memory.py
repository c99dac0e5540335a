"""In-memory transport: devices live in this process and are served one after another.

Messages still go through the full encode → bytes → decode path, so a simulation exercises the
same wire format, validation and byte counts as a deployment.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from edgefl.errors import WireError
from edgefl.transport.base import Accept, Delivery

log = logging.getLogger(__name__)

Handler = Callable[[bytes], bytes | None]  # None: nothing to answer (a message that is no request)


class InMemoryTransport:
    def __init__(self, handlers: Mapping[str, Handler] | None = None):
        self.handlers: dict[str, Handler] = dict(handlers or {})

    def connect(self, device_id: str, handler: Handler) -> None:
        self.handlers[device_id] = handler

    def request(self, messages: Mapping[str, bytes], *, timeout: float | None = None, accept: Accept) -> dict[str, Delivery]:
        out = {}
        for device_id, data in messages.items():
            handler = self.handlers.get(device_id)
            if handler is None:
                out[device_id] = Delivery(device_id, None, "device is not connected")
                continue
            t0 = time.perf_counter()
            try:
                reply = handler(data)
            except Exception as e:  # a crashing device is a failed delivery, not a crashed server
                log.warning("device %s failed: %s", device_id, e)
                out[device_id] = Delivery(device_id, None, f"{type(e).__name__}: {e}", time.perf_counter() - t0)
                continue
            seconds = time.perf_counter() - t0
            if reply is None:
                out[device_id] = Delivery(device_id, None, "no reply", seconds)
                continue
            try:
                value = accept(device_id, reply)
            except WireError as e:  # one reply per request here: a refused one is the device's failure
                out[device_id] = Delivery(device_id, None, f"rejected: {e}", seconds, rejected=(str(e),))
                continue
            out[device_id] = Delivery(device_id, reply, None, seconds, value)
        return out

    def close(self) -> None:
        self.handlers.clear()
