"""What a chunk and its acknowledgement are on the wire, the settings both sides read (the format
is described in :mod:`edgefl.transport.chunks`), and how either side's timer thread is joined."""

from __future__ import annotations

import math
import os
import struct
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from edgefl.errors import ConfigError, WireError
from edgefl.wire.crc import crc32

MAGIC = b"EFLCHNK1"
ACK_MAGIC = b"EFLCACK1"
HEADER = struct.Struct("<8s16sIIQIII")
ACK = struct.Struct("<8s16sIQB")
SACK_BITS = 64

PROGRESS, COMPLETE, REFUSED = 0, 1, 2


@dataclass(frozen=True)
class ChunkSettings:
    """How large messages are split, paced and reassembled (both sides read the same settings)."""

    threshold: int = 4 * 1024 * 1024  # messages longer than this travel in chunks
    chunk_size: int = 1024 * 1024
    window: int = 8  # unacknowledged chunks per destination
    max_inflight_bytes: int = 64 * 1024 * 1024  # unacknowledged chunk bytes, all destinations
    stall_after: float = 5.0  # seconds without progress before a re-send, plus the queue ahead
    assumed_rate: float = 2e6  # bytes/s before any acknowledgement has measured the path
    max_stall: float = 60.0
    max_stalls: int = 20  # consecutive re-sends without progress before a transfer is given up
    # receiving
    max_chunk_size: int = 16 * 1024 * 1024
    max_partial_per_sender: int = 2
    max_partial_bytes: int = 1024 * 1024 * 1024  # all senders together
    # one sender's share (None: one whole message of the receiver's max_bytes)
    max_sender_bytes: int | None = None
    remember_completed: int = 4096
    # a reassembly untouched this long is dropped (a live sender re-sends within max_stall)
    idle_after: float = 120.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ChunkSettings:
        """The defaults, overridden by ``EDGEFL_CHUNK_THRESHOLD``, ``EDGEFL_CHUNK_SIZE``,
        ``EDGEFL_CHUNK_WINDOW`` and ``EDGEFL_CHUNK_INFLIGHT`` (bytes, bytes, chunks, bytes)."""
        environ = os.environ if environ is None else environ
        names = {
            "threshold": "THRESHOLD",
            "chunk_size": "SIZE",
            "window": "WINDOW",
            "max_inflight_bytes": "INFLIGHT",
        }
        values = {}
        for name, var in names.items():
            text = environ.get(f"EDGEFL_CHUNK_{var}")
            if text:
                try:
                    values[name] = int(text)
                except ValueError:
                    raise ConfigError(f"EDGEFL_CHUNK_{var}={text!r} is not an integer") from None
        try:
            return cls(**values)
        except ValueError as e:
            raise ConfigError(f"chunk settings from the environment: {e}") from None

    def __post_init__(self) -> None:
        if not 1 <= self.window <= SACK_BITS:
            raise ValueError(f"window must be 1..{SACK_BITS} chunks")
        if not 0 < self.chunk_size <= self.max_chunk_size:
            raise ValueError("chunk_size must be positive and at most max_chunk_size")
        if self.max_inflight_bytes < self.chunk_size:
            raise ValueError("max_inflight_bytes must hold at least one chunk")


class ChunkRefused(WireError):
    """A whole message refused for good: :attr:`ack` tells its sender to stop sending it."""

    def __init__(self, message: str, ack: bytes):
        super().__init__(message)
        self.ack = ack


def is_chunk(data: bytes) -> bool:
    return data[:8] == MAGIC


def is_ack(data: bytes) -> bool:
    return data[:8] == ACK_MAGIC


@dataclass(frozen=True)
class ChunkHeader:
    message_id: bytes
    index: int
    count: int
    total: int
    chunk_size: int
    crc: int  # of the whole message
    chunk_crc: int

    def pack(self) -> bytes:
        return HEADER.pack(
            MAGIC,
            self.message_id,
            self.index,
            self.count,
            self.total,
            self.chunk_size,
            self.crc,
            self.chunk_crc,
        )

    def span(self) -> tuple[int, int]:
        start = self.index * self.chunk_size
        return start, min(self.total, start + self.chunk_size)


def parse_chunk(
    data: bytes, *, max_bytes: int, max_chunk_size: int
) -> tuple[ChunkHeader, memoryview]:
    """The header and data of one chunk, every field checked; nothing is allocated for it."""
    if len(data) < HEADER.size:
        raise WireError(f"chunk of {len(data)} bytes is shorter than its {HEADER.size}-byte header")
    magic, mid, index, count, total, chunk_size, crc, chunk_crc = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise WireError("not a chunk")
    if total < 1 or total > max_bytes:
        raise WireError(f"chunked message of {total} bytes: the limit is {max_bytes}")
    if chunk_size < 1 or chunk_size > max_chunk_size:
        raise WireError(f"chunk size {chunk_size}: the limit is {max_chunk_size}")
    if count != math.ceil(total / chunk_size):
        raise WireError(f"chunk count {count} does not fit {total} bytes in chunks of {chunk_size}")
    if index >= count:
        raise WireError(f"chunk index {index} of {count}")
    h = ChunkHeader(mid, index, count, total, chunk_size, crc, chunk_crc)
    start, end = h.span()
    body = memoryview(data)[HEADER.size :]
    if len(body) != end - start:
        raise WireError(f"chunk {index} of {count} carries {len(body)} bytes, not {end - start}")
    if crc32(body) != chunk_crc:
        raise WireError(f"chunk {index} of {count}: checksum mismatch")
    return h, body


def pack_ack(message_id: bytes, next_index: int, bitmap: int, status: int) -> bytes:
    return ACK.pack(ACK_MAGIC, message_id, next_index, bitmap, status)


def parse_ack(data: bytes) -> tuple[bytes, int, int, int]:
    if len(data) != ACK.size:
        raise WireError(f"chunk ack of {len(data)} bytes, not {ACK.size}")
    magic, mid, nxt, bitmap, status = ACK.unpack(data)
    if magic != ACK_MAGIC or status not in (PROGRESS, COMPLETE, REFUSED):
        raise WireError("not a chunk ack")
    return mid, nxt, bitmap, status


def join_timer(thread: threading.Thread | None, timeout: float = 5.0) -> None:
    """Wait for a side's timer thread to end after it was told to stop, unless there is none or
    this is it (a timer that stops its own side ends by itself)."""
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout)
