"""Large messages in chunks: splitting, flow control by acknowledged bytes, bounded reassembly.

An encoded envelope longer than :attr:`ChunkSettings.threshold` travels as chunks of
``chunk_size`` bytes, each one message on the same topic as the envelope would have taken::

    chunk = MAGIC | message id (16 bytes) | index u32 | count u32 | total u64 | chunk size u32
            | CRC-32 of the whole message u32 | CRC-32 of this chunk's data u32 | data

    ack   = ACK_MAGIC | message id (16 bytes) | next u32 | selective bitmap u64 | status u8

(little-endian). ``MAGIC`` read as a safetensors header length is far beyond any
:class:`~edgefl.wire.Limits`, so a chunk is never mistaken for an envelope. The receiver answers
each chunk with an ack on the reverse topic: ``next`` says every chunk below it has arrived, bit
``k`` of the bitmap that chunk ``next + 1 + k`` has too, and the status says whether the message is
complete (or refused for good).

**Sending** (:class:`ChunkSender`): at most ``window`` chunks per destination and
``max_inflight_bytes`` over all destinations are unacknowledged at any time, so neither the broker
nor the receiver ever queues more than that. A chunk is re-sent only when its transfer made no
progress (no newly acknowledged bytes) for a stall time that grows with the bytes in flight ahead
of it at the measured acknowledgement rate, and doubles with each consecutive stall: a message
still queued behind others is never re-sent because a fixed clock ran out.

**Receiving** (:class:`Reassembler`): every field of a chunk's header is checked before anything is
kept (total within ``max_bytes``, chunk size within ``max_chunk_size``, count equal to
``ceil(total / chunk size)``, index below count, the data's length and CRC-32). Memory is taken as
bytes arrive, never at the size a first chunk claims: each chunk held is charged its data plus
:data:`PIECE_OVERHEAD`. A sender has at most ``max_partial_per_sender`` messages in reassembly and
at most its share of the budget (``max_sender_bytes``, default one whole message); all senders
together at most ``max_partial_bytes``, and when that is full a sender below the largest holder
evicts that holder's oldest partial, so a sender over its share is refused while the others keep
their room. A timer thread drops partials untouched for ``idle_after`` seconds, with or without
traffic. A chunk that disagrees with its message's first chunk is refused. A complete message must
match the whole-message CRC-32, and is then handed to the caller, who decodes and checks it exactly
as an unchunked envelope. Every refusal is a :class:`~edgefl.errors.WireError`, counted, and leaves
the other reassemblies untouched.
"""

from edgefl.transport.chunks.frames import (
    ACK,
    ACK_MAGIC,
    COMPLETE,
    HEADER,
    MAGIC,
    PROGRESS,
    REFUSED,
    SACK_BITS,
    ChunkHeader,
    ChunkRefused,
    ChunkSettings,
    is_ack,
    is_chunk,
    pack_ack,
    parse_ack,
    parse_chunk,
)
from edgefl.transport.chunks.reassembly import PIECE_OVERHEAD, Reassembler, ReassemblyStats
from edgefl.transport.chunks.sender import ChunkCounters, ChunkSender, Outgoing, SendStats, split

__all__ = [
    "ACK",
    "ACK_MAGIC",
    "COMPLETE",
    "HEADER",
    "MAGIC",
    "PIECE_OVERHEAD",
    "PROGRESS",
    "REFUSED",
    "SACK_BITS",
    "ChunkCounters",
    "ChunkHeader",
    "ChunkRefused",
    "ChunkSender",
    "ChunkSettings",
    "Outgoing",
    "Reassembler",
    "ReassemblyStats",
    "SendStats",
    "is_ack",
    "is_chunk",
    "pack_ack",
    "parse_ack",
    "parse_chunk",
    "split",
]
