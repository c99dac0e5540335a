"""The server's view of a transport: send each device its bytes, collect the replies.

A transport moves opaque envelopes; it never looks inside them and never imports an algorithm.
A device that fails or misses the deadline yields a :class:`Delivery` with ``error`` set:
data for the round's record, not an exception.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Delivery:
    device_id: str
    reply: bytes | None  # the device's reply envelope, or None when it failed or timed out
    error: str | None = None
    seconds: float = 0.0  # from sending to receiving the reply


class Transport(Protocol):
    def request(self, messages: Mapping[str, bytes], *, timeout: float | None) -> dict[str, Delivery]:
        """Deliver ``messages`` (device id → envelope bytes) and wait for every reply or the timeout."""
        ...

    def close(self) -> None: ...
