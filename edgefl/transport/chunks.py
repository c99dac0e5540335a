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

from __future__ import annotations

import logging
import math
import os
import struct
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from edgefl.errors import ConfigError, WireError

log = logging.getLogger(__name__)

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
    max_sender_bytes: int | None = None  # one sender's share (None: one whole message of the receiver's max_bytes)
    remember_completed: int = 4096
    idle_after: float = 120.0  # a reassembly untouched this long is dropped (a live sender re-sends within max_stall)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ChunkSettings:
        """The defaults, overridden by ``EDGEFL_CHUNK_THRESHOLD``, ``EDGEFL_CHUNK_SIZE``,
        ``EDGEFL_CHUNK_WINDOW`` and ``EDGEFL_CHUNK_INFLIGHT`` (bytes, bytes, chunks, bytes)."""
        environ = os.environ if environ is None else environ
        names = {"threshold": "THRESHOLD", "chunk_size": "SIZE", "window": "WINDOW", "max_inflight_bytes": "INFLIGHT"}
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
        return HEADER.pack(MAGIC, self.message_id, self.index, self.count, self.total, self.chunk_size, self.crc, self.chunk_crc)

    def span(self) -> tuple[int, int]:
        start = self.index * self.chunk_size
        return start, min(self.total, start + self.chunk_size)


def split(data: bytes, message_id: bytes, chunk_size: int) -> list[bytes]:
    """Every chunk of ``data`` (for tests and small callers; :class:`Outgoing` builds them lazily)."""
    out = Outgoing("", data, message_id, chunk_size)
    return [out.chunk(i) for i in range(out.count)]


def parse_chunk(data: bytes, *, max_bytes: int, max_chunk_size: int) -> tuple[ChunkHeader, memoryview]:
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
    if zlib.crc32(body) != chunk_crc:
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


# --- receiving ------------------------------------------------------------------------------------


#: what the reassembly budget charges for each chunk held besides its data (its object and index)
PIECE_OVERHEAD = 128


@dataclass
class _Partial:
    """A message being reassembled: only the chunks that arrived are held (never the claimed size)."""

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

    def __init__(self, settings: ChunkSettings = ChunkSettings(), *, max_bytes: int, clock: Callable[[], float] = time.monotonic,
                 timer: bool = True):
        self.settings, self.max_bytes, self.clock = settings, max_bytes, clock
        self.sender_share = settings.max_sender_bytes or max_bytes + PIECE_OVERHEAD * math.ceil(max_bytes / settings.chunk_size)
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
        if p is not None and (p.header.count, p.header.total, p.header.chunk_size, p.header.crc) != (h.count, h.total, h.chunk_size, h.crc):
            raise WireError(f"chunk {h.index} disagrees with its message's header (count, size or checksum)")
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
        if zlib.crc32(message) != h.crc:
            # every chunk passed its own checksum: the sender's header lies about the whole
            raise ChunkRefused(f"reassembled message of {h.total} bytes fails its checksum", pack_ack(h.message_id, 0, 0, REFUSED))
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
            raise WireError(f"sender holds {mine} bytes in reassembly; its share is {self.sender_share}")
        while self.partial_bytes + cost > s.max_partial_bytes:
            others = [(held, other) for other, held in self.held.items() if other != sender]
            held, top = max(others, default=(0, ""))
            if held <= mine + cost:
                raise WireError(f"no room to reassemble {cost} more bytes ({self.partial_bytes} of {s.max_partial_bytes} in use)")
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
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(5)

    def _ensure_timer(self) -> None:
        if self.use_timer and self.thread is None and not self.closed:
            self.thread = threading.Thread(target=self._sweep, name="edgefl-reassembly", daemon=True)
            self.thread.start()

    def _sweep(self) -> None:
        """The expiry timer: every quarter of ``idle_after``, with or without traffic."""
        every = max(0.05, self.settings.idle_after / 4)
        with self.lock:
            while not self.closed:
                self.lock.wait(every)
                if not self.closed:
                    self._drop_idle(self.settings.idle_after)


# --- sending --------------------------------------------------------------------------------------


class Outgoing:
    """One message being sent in chunks to one destination."""

    def __init__(self, dest: str, data: bytes, message_id: bytes, chunk_size: int, on_done: Callable[[bool], None] | None = None):
        if len(message_id) != 16:
            raise ValueError("a chunked message's id is 16 bytes")
        self.dest, self.data, self.message_id, self.chunk_size = dest, memoryview(data), message_id, chunk_size
        self.total = len(data)
        self.count = math.ceil(self.total / chunk_size)
        self.crc = zlib.crc32(self.data)
        self.on_done = on_done
        self.acked = bytearray(self.count)  # per chunk: acknowledged
        self.next = 0  # every chunk below is acknowledged
        self.sent_upto = 0  # chunks below have been sent at least once
        self.unacked: set[int] = set()  # sent, not acknowledged
        self.last_progress = 0.0
        self.stalls = 0
        self.resent = 0
        self.state = "sending"  # "done", "refused", "given up", "cancelled"

    def chunk(self, i: int) -> bytes:
        start = i * self.chunk_size
        body = self.data[start : start + self.chunk_size]
        return ChunkHeader(self.message_id, i, self.count, self.total, self.chunk_size, self.crc, zlib.crc32(body)).pack() + body

    def size(self, i: int) -> int:
        return min(self.chunk_size, self.total - i * self.chunk_size)

    @property
    def inflight_bytes(self) -> int:
        return sum(self.size(i) for i in self.unacked)

    def ack(self, nxt: int, bitmap: int) -> int:
        """Apply an acknowledgement; the newly acknowledged bytes."""
        newly = 0
        for i in [i for i in self.unacked if i < nxt or (i > nxt and (bitmap >> (i - nxt - 1)) & 1)]:
            self.unacked.discard(i)
            self.acked[i] = 1
            newly += self.size(i)
        while self.next < self.count and self.acked[self.next]:
            self.next += 1
        return newly


@dataclass
class SendStats:
    messages: int = 0
    chunks: int = 0
    resent: int = 0  # chunks sent again after a stall
    stalls: int = 0
    given_up: int = 0
    refused: int = 0
    bytes: int = 0
    peak_inflight_bytes: int = 0
    rejected_acks: int = 0


class ChunkSender:
    """Paces chunked messages: a window per destination, a byte budget over all of them, and
    re-sends driven by the lack of progress.

    ``publish(topic, chunk)`` is called outside the sender's lock (from the caller's thread, the
    network thread that delivered an ack, or the sender's own timer thread).
    """

    def __init__(
        self,
        publish: Callable[[str, bytes], None],
        settings: ChunkSettings = ChunkSettings(),
        *,
        clock: Callable[[], float] = time.monotonic,
        timer: bool = True,
        name: str = "chunks",
    ):
        self.publish, self.settings, self.clock = publish, settings, clock
        self.lock = threading.Condition()
        self.transfers: OrderedDict[tuple[str, bytes], Outgoing] = OrderedDict()
        self.inflight = 0  # unacknowledged chunk bytes, all destinations
        self.rate = 0.0  # acknowledged bytes per second, smoothed
        self.gap = 0.0  # the longest recent wait between two acknowledgements that made progress (decays)
        self._rate_mark: tuple[float, int] | None = None
        self._acked_total = 0
        self.stats = SendStats()
        self.stopping = False
        self.thread: threading.Thread | None = None
        self.use_timer, self.name = timer, name

    # -- the caller's side --
    def send(self, dest: str, data: bytes, message_id: bytes, on_done: Callable[[bool], None] | None = None) -> Outgoing:
        """Start sending ``data`` to ``dest`` (a topic); ``on_done(ok)`` when it is acknowledged whole
        (True) or refused / given up (False). A message already being sent to ``dest`` is left going."""
        with self.lock:
            key = (dest, message_id)
            out = self.transfers.get(key)
            if out is None or out.state != "sending":
                out = Outgoing(dest, data, message_id, self.settings.chunk_size, on_done)
                out.last_progress = self.clock()
                self.transfers[key] = out
                self.stats.messages += 1
            batch = self._fill()
            self._ensure_timer()
        self._publish(batch)
        return out

    def active(self, dest: str, message_id: bytes) -> bool:
        with self.lock:
            out = self.transfers.get((dest, message_id))
            return out is not None and out.state == "sending"

    def cancel(self, dest: str, message_id: bytes) -> None:
        with self.lock:
            out = self.transfers.pop((dest, message_id), None)
            if out is not None:
                self._release(out, "cancelled")
            batch = self._fill()
        self._publish(batch)

    def on_ack(self, dest: str, data: bytes) -> None:
        """An acknowledgement from ``dest``'s receiver (raises WireError on a malformed one)."""
        try:
            mid, nxt, bitmap, status = parse_ack(data)
        except WireError:
            with self.lock:
                self.stats.rejected_acks += 1
            raise
        done: list[tuple[Outgoing, bool]] = []
        with self.lock:
            out = self.transfers.get((dest, mid))
            if out is None or out.state != "sending":
                return  # a late ack of a finished transfer
            if nxt > out.count:
                self.stats.rejected_acks += 1
                raise WireError(f"chunk ack names chunk {nxt} of {out.count}")
            before = out.inflight_bytes
            newly = out.ack(nxt, bitmap)
            self.inflight -= before - out.inflight_bytes
            now = self.clock()
            if newly:
                self.gap = max(now - out.last_progress, 0.9 * self.gap)
                out.last_progress, out.stalls = now, 0
                self._measure(now, newly)
            if status == COMPLETE or (out.next >= out.count):
                self._release(out, "done")
                done.append((out, True))
            elif status == REFUSED:
                self._release(out, "refused")
                self.stats.refused += 1
                done.append((out, False))
            batch = self._fill()
        self._publish(batch)
        for out, ok in done:
            self._finished(out, ok)

    def poll(self) -> float:
        """Re-send what stalled; the seconds until the next stall could fall due."""
        now = self.clock()
        batch: list[tuple[str, bytes]] = []
        done: list[Outgoing] = []
        wake = self.settings.max_stall
        with self.lock:
            for out in list(self.transfers.values()):
                if out.state != "sending" or not out.unacked:
                    continue
                due = out.last_progress + self.stall_time(out)
                if now < due:
                    wake = min(wake, due - now)
                    continue
                out.stalls += 1
                self.stats.stalls += 1
                if out.stalls > self.settings.max_stalls:
                    log.warning("%s: giving up on a %d-byte message to %s after %d stalls", self.name, out.total, out.dest, out.stalls - 1)
                    self._release(out, "given up")
                    self.stats.given_up += 1
                    done.append(out)
                    continue
                out.last_progress = now  # the re-sent chunks get their own time to arrive
                for i in sorted(out.unacked):
                    batch.append((out.dest, out.chunk(i)))
                    out.resent += 1
                    self.stats.resent += 1
                log.info("%s: no progress on a message to %s for %.1f s; re-sending %d chunks", self.name, out.dest, self.stall_time(out), len(out.unacked))
                wake = min(wake, self.stall_time(out))
            batch += self._fill()
        self._publish(batch)
        for out in done:
            self._finished(out, False)
        return max(0.01, wake)

    def stall_time(self, out: Outgoing) -> float:
        """How long ``out`` may make no progress: the base (or twice the longest recent pause
        between progressing acks, if longer: a receiver busy decoding a large message pauses its
        acks), plus the time the bytes in flight (all destinations: they share the path) take at
        the measured rate, doubled per stall."""
        s = self.settings
        rate = self.rate if self.rate > 0 else s.assumed_rate
        return min(s.max_stall, (max(s.stall_after, 2 * self.gap) + self.inflight / rate) * (2**out.stalls))

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            self.lock.notify_all()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(5)

    # -- internals (under the lock) --
    def _fill(self) -> list[tuple[str, bytes]]:
        """First transmissions the window and the budget allow, round-robin over transfers."""
        s = self.settings
        batch: list[tuple[str, bytes]] = []
        per_dest: dict[str, int] = {}
        for out in self.transfers.values():
            if out.state == "sending":
                per_dest[out.dest] = per_dest.get(out.dest, 0) + len(out.unacked)
        progress = True
        while progress:
            progress = False
            for out in self.transfers.values():
                if out.state != "sending" or out.sent_upto >= out.count or per_dest[out.dest] >= s.window:
                    continue
                if out.sent_upto > out.next + SACK_BITS:  # beyond what an ack can name selectively
                    continue
                size = out.size(out.sent_upto)
                if self.inflight + size > s.max_inflight_bytes:
                    continue
                i = out.sent_upto
                if i == 0:
                    out.last_progress = self.clock()  # its clock starts when its first chunk goes
                out.sent_upto += 1
                out.unacked.add(i)
                per_dest[out.dest] += 1
                self.inflight += size
                self.stats.peak_inflight_bytes = max(self.stats.peak_inflight_bytes, self.inflight)
                batch.append((out.dest, out.chunk(i)))
                progress = True
        if batch:
            self.lock.notify_all()
        return batch

    def _release(self, out: Outgoing, state: str) -> None:
        self.inflight -= out.inflight_bytes
        out.unacked.clear()
        out.state = state
        self.transfers.pop((out.dest, out.message_id), None)

    def _measure(self, now: float, newly: int) -> None:
        self._acked_total += newly
        if self._rate_mark is None:
            self._rate_mark = (now, self._acked_total)
            return
        t0, b0 = self._rate_mark
        if now - t0 >= 0.05:
            sample = (self._acked_total - b0) / (now - t0)
            self.rate = sample if self.rate == 0 else 0.7 * self.rate + 0.3 * sample
            self._rate_mark = (now, self._acked_total)

    def _publish(self, batch: list[tuple[str, bytes]]) -> None:
        for topic, chunk in batch:
            self.stats.chunks += 1
            self.stats.bytes += len(chunk)
            self.publish(topic, chunk)

    def _finished(self, out: Outgoing, ok: bool) -> None:
        if out.on_done is not None:
            try:
                out.on_done(ok)
            except Exception:  # noqa: BLE001 - a caller's bug must not stop the pacing
                log.exception("%s: completion callback failed", self.name)

    def _ensure_timer(self) -> None:
        if self.use_timer and self.thread is None:
            self.thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self.thread.start()

    def _run(self) -> None:
        while True:
            with self.lock:
                while not self.stopping and not any(o.unacked for o in self.transfers.values()):
                    self.lock.wait(1.0)
                if self.stopping:
                    return
            try:
                wake = self.poll()
            except Exception:  # noqa: BLE001 - the timer must survive a publish error
                log.exception("%s: re-send timer failed", self.name)
                wake = 1.0
            with self.lock:
                if not self.stopping:
                    self.lock.wait(min(wake, 1.0))


@dataclass
class ChunkCounters:
    """What an endpoint's chunk layer did, for run records and benchmarks."""

    sent: SendStats = field(default_factory=SendStats)
    received: ReassemblyStats = field(default_factory=ReassemblyStats)
