"""The application-level request/ack protocol's parts that both sides share (the protocol is
described in :mod:`edgefl.transport.mqtt`): re-send delays and ``ack`` envelopes."""

from __future__ import annotations

from edgefl.wire import Envelope, Payload, encode
from edgefl.wire.validate import Routing


def retry_delay(base: float, nbytes: int) -> float:
    """First re-send delay for a message of ``nbytes``: the base plus the time a slow link
    (2 MB/s) needs to carry it, so large envelopes still queued at the broker are not re-sent
    in a storm."""
    return base + nbytes / 2e6


def ack_envelope(fleet: str, device_id: str, routing: Routing) -> bytes:
    return encode(
        Envelope(
            "ack",
            routing.round,
            device_id,
            fleet=fleet,
            payload=Payload({}, {"ack": routing.message_id}),
        )
    )
