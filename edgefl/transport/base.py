"""The server's view of a transport: send each device its bytes, collect the replies.

A transport moves opaque envelopes; it never looks inside them and never imports an algorithm.
A device that fails or misses the deadline yields a :class:`Delivery` with ``error`` set:
data for the round's record, not an exception.

The caller passes ``accept(device_id, reply_bytes)``: it decodes and checks a reply against its
request and raises :class:`~edgefl.errors.WireError` to refuse it. A transport keeps the first
*accepted* reply per device; a refused one is counted in ``Delivery.rejected`` and never displaces
or blocks the real one (the transport goes on waiting for it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

#: Decodes and checks a reply (device id, bytes); raises WireError to refuse it.
Accept = Callable[[str, bytes], Any]


@dataclass(frozen=True)
class Delivery:
    device_id: str
    reply: bytes | None  # the device's reply envelope, or None when it failed or timed out
    error: str | None = None
    seconds: float = 0.0  # from sending to receiving the reply
    value: Any = None  # what ``accept`` returned for the reply (the decoded envelope)
    rejected: tuple[str, ...] = ()  # why each refused reply was refused


class Transport(Protocol):
    def request(self, messages: Mapping[str, bytes], *, timeout: float | None, accept: Accept) -> dict[str, Delivery]:
        """Deliver ``messages`` (device id → envelope bytes) and wait for every accepted reply or the timeout."""
        ...

    def close(self) -> None: ...
