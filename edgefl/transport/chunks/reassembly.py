"""Receiving chunks: bounded reassembly into whole messages (:mod:`edgefl.transport.chunks`)."""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from edgefl.errors import WireError
from edgefl.transport.chunks.frames import (
    COMPLETE,
    PROGRESS,
    REFUSED,
    SACK_BITS,
    ChunkHeader,
    ChunkRefused,
    ChunkSettings,
    join_timer,
    pack_ack,
    parse_chunk,
)
from edgefl.wire.crc import crc32

#: what the reassembly budget charges for each chunk held besides its data (its object and index)
PIECE_OVERHEAD = 128


@dataclass
class _Partial:
    """A message being reassembled: only the chunks that arrived are held (never the claimed
    size)."""

    header: ChunkHeader
    pieces: dict[int, bytes] = field(default_factory=dict)
    held: int = 0  # bytes charged to the budget: each piece's data plus PIECE_OVERHEAD
    next: int = 0  # every chunk below has arrived
    touched: float = 0.0

    def bitmap(self) -> int:
        bits = 0
        for k in range(SACK_BITS):
            i = self.next + 1 + k
            if i >= self.header.count:
                break
            if i in self.pieces:
                bits |= 1 << k
        return bits


@dataclass
class ReassemblyStats:
    chunks: int = 0
    duplicates: int = 0
    completed: int = 0
    rejected: int = 0
    evicted: int = 0
    over_share: int = 0  # chunks refused because their sender held its share of the budget


class Reassembler:
    """Chunks in, whole messages out, with bounded memory per sender and in all.

    ``add(sender, chunk)`` returns ``(message or None, ack)``: the ack goes back to the sender;
    the message, once complete and matching its checksum, goes through the caller's ordinary decode
    and checks. A refused chunk raises :class:`WireError` (counted in :attr:`stats`); a refused
    *message* (it fails its whole checksum) raises :class:`ChunkRefused`, whose ``ack`` tells the
    sender to give it up.

    Memory is taken as bytes arrive: a first chunk claiming 256 MiB costs what it carries. Each
    sender may hold at most ``max_sender_bytes`` (default: one whole message, ``max_bytes``), all
    senders together ``max_partial_bytes``; when that is full, a sender holding less makes room by
    evicting the oldest partial of the sender holding the most (while that one holds more than it
    would), so a sender over its share is refused while the others keep their room. Partials
    untouched for ``idle_after`` seconds are dropped by a timer thread that runs without traffic
    (:meth:`close` stops it).
    """

    def __init__(
        self,
        settings: ChunkSettings = ChunkSettings(),
        *,
        max_bytes: int,
        clock: Callable[[], float] = time.monotonic,
        timer: bool = True,
    ):
        self.settings, self.max_bytes, self.clock = settings, max_bytes, clock
        self.sender_share = settings.max_sender_bytes or max_bytes + PIECE_OVERHEAD * math.ceil(
            max_bytes / settings.chunk_size
        )
        self.partial: dict[str, OrderedDict[bytes, _Partial]] = {}
        self.held: dict[str, int] = {}  # sender → bytes it holds in partials
        self.completed: OrderedDict[tuple[str, bytes], None] = OrderedDict()
        self.partial_bytes = 0
        self.stats = ReassemblyStats()
        self.lock = threading.Condition()
        self.use_timer = timer
        self.thread: threading.Thread | None = None
        self.closed = False

    def add(self, sender: str, data: bytes) -> tuple[bytes | None, bytes | None]:
        with self.lock:
            try:
                return self._add(sender, data)
            except WireError:
                self.stats.rejected += 1
                raise

    def _add(self, sender: str, data: bytes) -> tuple[bytes | None, bytes | None]:
        s = self.settings
        h, body = parse_chunk(data, max_bytes=self.max_bytes, max_chunk_size=s.max_chunk_size)
        self.stats.chunks += 1
        if (sender, h.message_id) in self.completed:
            self.stats.duplicates += 1
            return None, pack_ack(h.message_id, h.count, 0, COMPLETE)
        mine = self.partial.get(sender)
        p = mine.get(h.message_id) if mine is not None else None
        if p is not None and (
            p.header.count,
            p.header.total,
            p.header.chunk_size,
            p.header.crc,
        ) != (h.count, h.total, h.chunk_size, h.crc):
            raise WireError(
                f"chunk {h.index} disagrees with its message's header (count, size or checksum)"
            )
        if p is not None and h.index in p.pieces:
            self.stats.duplicates += 1
            p.touched = self.clock()
            return None, pack_ack(h.message_id, p.next, p.bitmap(), PROGRESS)
        if p is None and mine is not None and len(mine) >= s.max_partial_per_sender:
            # the sender moved on (a sender has one message in flight per peer): its oldest
            # unfinished message goes; the sender's own progress timer re-sends it if it still cares
            self._evict(sender, next(iter(mine)))
        cost = len(body) + PIECE_OVERHEAD
        self._make_room(sender, cost)
        if p is None:
            mine = self.partial.setdefault(sender, OrderedDict())
            p = mine[h.message_id] = _Partial(h)
            self._ensure_timer()
        p.touched = self.clock()
        p.pieces[h.index] = bytes(body)
        p.held += cost
        self.held[sender] = self.held.get(sender, 0) + cost
        self.partial_bytes += cost
        while p.next < h.count and p.next in p.pieces:
            p.next += 1
        if len(p.pieces) < h.count:
            return None, pack_ack(h.message_id, p.next, p.bitmap(), PROGRESS)
        self._evict(sender, h.message_id, counted=False)
        message = b"".join(p.pieces[i] for i in range(h.count))
        p.pieces.clear()
        if crc32(message) != h.crc:
            # every chunk passed its own checksum: the sender's header lies about the whole
            raise ChunkRefused(
                f"reassembled message of {h.total} bytes fails its checksum",
                pack_ack(h.message_id, 0, 0, REFUSED),
            )
        self._remember(sender, h.message_id)
        self.stats.completed += 1
        return message, pack_ack(h.message_id, h.count, 0, COMPLETE)

    def _make_room(self, sender: str, cost: int) -> None:
        """Refuse a sender over its share; when the whole budget is full, evict the partials of the
        sender holding the most while it holds more than this one would."""
        s = self.settings
        mine = self.held.get(sender, 0)
        if mine + cost > self.sender_share:
            self.stats.over_share += 1
            raise WireError(
                f"sender holds {mine} bytes in reassembly; its share is {self.sender_share}"
            )
        while self.partial_bytes + cost > s.max_partial_bytes:
            others = [(held, other) for other, held in self.held.items() if other != sender]
            held, top = max(others, default=(0, ""))
            if held <= mine + cost:
                raise WireError(
                    f"no room to reassemble {cost} more bytes ({self.partial_bytes} of "
                    f"{s.max_partial_bytes} in use)"
                )
            self._evict(top, next(iter(self.partial[top])))

    def _evict(self, sender: str, message_id: bytes, counted: bool = True) -> None:
        mine = self.partial[sender]
        p = mine.pop(message_id)
        self.partial_bytes -= p.held
        self.held[sender] -= p.held
        if not mine:
            del self.partial[sender]
            del self.held[sender]
        if counted:
            self.stats.evicted += 1

    def _remember(self, sender: str, message_id: bytes) -> None:
        self.completed[(sender, message_id)] = None
        while len(self.completed) > self.settings.remember_completed:
            self.completed.popitem(last=False)

    def drop_idle(self, older_than: float) -> int:
        """Forget reassemblies untouched for ``older_than`` seconds (a sender that vanished)."""
        with self.lock:
            return self._drop_idle(older_than)

    def _drop_idle(self, older_than: float) -> int:
        now, dropped = self.clock(), 0
        for sender in list(self.partial):
            for mid in [m for m, p in self.partial[sender].items() if now - p.touched > older_than]:
                self._evict(sender, mid)
                dropped += 1
        return dropped

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.lock.notify_all()
        join_timer(self.thread)

    def _ensure_timer(self) -> None:
        if self.use_timer and self.thread is None and not self.closed:
            self.thread = threading.Thread(
                target=self._sweep, name="edgefl-reassembly", daemon=True
            )
            self.thread.start()

    def _sweep(self) -> None:
        """The expiry timer: every quarter of ``idle_after``, with or without traffic."""
        every = max(0.05, self.settings.idle_after / 4)
        with self.lock:
            while not self.closed:
                self.lock.wait(every)
                if not self.closed:
                    self._drop_idle(self.settings.idle_after)
