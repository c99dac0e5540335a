"""The server's view of a transport: send each device its envelope, collect the replies.

Two layers:

- :class:`Transport` is what the round loop talks to: it moves :class:`~edgefl.wire.Envelope`
  objects. The in-memory transport (:mod:`edgefl.transport.memory`) hands them over as checked,
  read-only views (:func:`edgefl.wire.check`): no bytes, no copy, no checksum, with the byte
  counts computed exactly (:func:`edgefl.wire.encoded_size`).
- :class:`WireTransport` moves the envelopes' bytes (MQTT, the worker processes' pipes) and never
  looks inside them. :class:`Encoded` makes one a :class:`Transport`: it encodes each request and
  decodes each reply (:func:`edgefl.wire.decode`, with its limits) before the caller's check.

A device that fails or misses the deadline yields a :class:`Delivery` with ``error`` set: data for
the round's record, not an exception. The caller passes ``accept(device_id, reply)``: it checks a
reply against its request and raises :class:`~edgefl.errors.WireError` to refuse it. A transport
keeps the first *accepted* reply per device; a refused one is counted in ``Delivery.rejected``
and never displaces or blocks the real one (a wire transport goes on waiting for it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from edgefl.errors import WireError
from edgefl.wire import Envelope, Limits, decode, encode

#: Checks a reply (device id, the reply: an Envelope, or bytes on a wire transport); raises
#: WireError to refuse it.
Accept = Callable[[str, Any], Any]


@dataclass(frozen=True)
class Delivery:
    device_id: str
    # the device's reply (an Envelope; bytes on a wire transport), or None when it failed or timed
    # out
    reply: Any
    error: str | None = None
    seconds: float = 0.0  # from sending to receiving the reply
    value: Any = None  # what ``accept`` returned for the reply
    rejected: tuple[str, ...] = ()  # why each refused reply was refused
    bytes_down: int = 0  # the request's size as sent (encoded), 0 when it was not sent
    bytes_up: int = 0  # the accepted reply's size (encoded)


def answered(device_id: str, reply: Any, seconds: float, accept: Accept) -> Delivery:
    """The delivery of a reply that arrived: accepted, or refused by ``accept`` (a WireError)."""
    try:
        value = accept(device_id, reply)
    except WireError as e:
        return Delivery(device_id, None, f"rejected: {e}", seconds, rejected=(str(e),))
    return Delivery(device_id, reply, None, seconds, value)


#: What a transport carries: envelopes (:data:`Transport`) or their bytes (:data:`WireTransport`).
Message = TypeVar("Message", Envelope, bytes)


class Carrier(Protocol[Message]):
    def request(
        self, messages: Mapping[str, Message], *, timeout: float | None, accept: Accept
    ) -> dict[str, Delivery]:
        """Deliver ``messages`` (device id → envelope, or its bytes on a wire transport, where
        ``accept`` is given the reply's bytes) and wait for every accepted reply or the
        timeout."""
        ...

    def close(self) -> None: ...


#: What the round loop talks to: it moves envelopes.
Transport = Carrier[Envelope]
#: What moves the envelopes' bytes (MQTT, the worker processes' pipes).
WireTransport = Carrier[bytes]


class Encoded:
    """A :class:`Transport` over a :class:`WireTransport`: requests are encoded, replies decoded
    under ``limits`` and then given to the caller's ``accept``."""

    def __init__(self, wire: WireTransport, limits: Limits = Limits()):
        self.wire, self.limits = wire, limits
        self._open_sizes: dict[str, int] = {}  # device → the size of its open request (submit)

    def _encoded(
        self, messages: Mapping[str, Envelope]
    ) -> tuple[dict[str, bytes], dict[str, Delivery]]:
        """Each message's bytes, and a "not sent" Delivery for each that does not encode."""
        data, out = {}, {}
        for device_id, env in messages.items():
            try:
                data[device_id] = encode(env)
            except WireError as e:
                out[device_id] = Delivery(device_id, None, f"not sent: {e}")
        return data, out

    def _decoding(self, accept: Accept) -> Accept:
        """``accept`` for the wire transport: the reply's bytes decoded under the limits first."""
        limits = self.limits
        return lambda d, raw: accept(d, decode(raw, limits))

    def request(
        self, messages: Mapping[str, Envelope], *, timeout: float | None, accept: Accept
    ) -> dict[str, Delivery]:
        data, out = self._encoded(messages)
        delivered = self.wire.request(data, timeout=timeout, accept=self._decoding(accept))
        for device_id, d in delivered.items():
            out[device_id] = dataclasses.replace(
                d,
                bytes_down=len(data[device_id]),
                bytes_up=len(d.reply) if d.reply is not None else 0,
                reply=d.value if d.reply is not None else None,
            )
        return out

    # -- requests that stay open (asynchronous aggregation), where the wire transport has them --
    @property
    def asynchronous(self) -> bool:
        """Whether requests can stay open across calls (:meth:`submit`, :meth:`arrivals`)."""
        return hasattr(self.wire, "submit")

    def submit(self, messages: Mapping[str, Envelope], *, accept: Accept) -> dict[str, Delivery]:
        """Send without waiting: a Delivery per message, ``error`` set where it was not sent,
        else only its ``bytes_down``; the replies come through :meth:`arrivals`."""
        data, out = self._encoded(messages)
        failed = self.wire.submit(data, accept=self._decoding(accept))
        for device_id, raw in data.items():
            self._open_sizes[device_id] = len(raw)
            out[device_id] = failed.get(device_id) or Delivery(device_id, None, bytes_down=len(raw))
        return out

    def arrivals(
        self, device_ids: Collection[str], *, most: int, timeout: float | None
    ) -> dict[str, Delivery]:
        """Replies to open requests as they come (the wire transport's ``arrivals``), decoded."""
        got = self.wire.arrivals(device_ids, most=most, timeout=timeout)
        return {d: self._decoded(d, delivery) for d, delivery in got.items()}

    def cancel(self, device_ids: Collection[str], reason: str) -> dict[str, Delivery]:
        cancelled = self.wire.cancel(device_ids, reason)
        return {d: self._decoded(d, delivery) for d, delivery in cancelled.items()}

    def _decoded(self, device_id: str, d: Delivery) -> Delivery:
        size = self._open_sizes.pop(device_id, 0)
        up = len(d.reply) if d.reply is not None else 0
        reply = d.value if d.reply is not None else None
        return dataclasses.replace(d, reply=reply, bytes_down=size, bytes_up=up)

    def close(self) -> None:
        self.wire.close()
