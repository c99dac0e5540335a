"""In-memory transport: devices live in this process and are served one after another.

Envelopes are handed over without bytes: :func:`edgefl.wire.check` applies every check a decoder
applies (routing and metadata schemas, dtype whitelist, limits, finite values) and gives the
receiver read-only views of the sender's arrays, so a large model costs no copy and no checksum
(nothing crosses a wire). Each exchange records the bytes the envelope would take on a wire,
computed exactly (:func:`edgefl.wire.encoded_size`), so a simulation reports the traffic of a
deployment.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from edgefl.errors import WireError
from edgefl.transport.base import Accept, Delivery
from edgefl.wire import Envelope, Limits, checked_size

log = logging.getLogger(__name__)

# None: nothing to answer (a message that is no request)
Handler = Callable[[Envelope], Envelope | None]


class InMemoryTransport:
    def __init__(self, handlers: Mapping[str, Handler] | None = None, *, limits: Limits = Limits()):
        self.handlers: dict[str, Handler] = dict(handlers or {})
        self.limits = limits

    def connect(self, device_id: str, handler: Handler) -> None:
        self.handlers[device_id] = handler

    def request(
        self, messages: Mapping[str, Envelope], *, timeout: float | None = None, accept: Accept
    ) -> dict[str, Delivery]:
        out = {}
        for device_id, env in messages.items():
            handler = self.handlers.get(device_id)
            if handler is None:
                out[device_id] = Delivery(device_id, None, "device is not connected")
                continue
            try:
                down, size_down = checked_size(env, self.limits)
            except WireError as e:
                out[device_id] = Delivery(device_id, None, f"not sent: {e}")
                continue
            t0 = time.perf_counter()
            try:
                reply = handler(down)
            except Exception as e:  # a crashing device is a failed delivery, not a crashed server
                log.warning("device %s failed: %s", device_id, e)
                out[device_id] = Delivery(
                    device_id,
                    None,
                    f"{type(e).__name__}: {e}",
                    time.perf_counter() - t0,
                    bytes_down=size_down,
                )
                continue
            seconds = time.perf_counter() - t0
            if reply is None:
                out[device_id] = Delivery(
                    device_id, None, "no reply", seconds, bytes_down=size_down
                )
                continue
            try:  # what the server's decoder would check, then the caller's check
                up, size_up = checked_size(reply, self.limits)
                value = accept(device_id, up)
            # one reply per request here: a refused one is the device's failure
            except WireError as e:
                out[device_id] = Delivery(
                    device_id,
                    None,
                    f"rejected: {e}",
                    seconds,
                    rejected=(str(e),),
                    bytes_down=size_down,
                )
                continue
            out[device_id] = Delivery(
                device_id, up, None, seconds, value, bytes_down=size_down, bytes_up=size_up
            )
        return out

    def close(self) -> None:
        self.handlers.clear()
