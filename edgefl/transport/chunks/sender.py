"""Sending chunks: a window per destination, a byte budget over all, re-sends driven by the
lack of progress (:mod:`edgefl.transport.chunks`)."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from edgefl.errors import WireError
from edgefl.transport.chunks.frames import (
    COMPLETE,
    REFUSED,
    SACK_BITS,
    ChunkHeader,
    ChunkSettings,
    join_timer,
    parse_ack,
)
from edgefl.transport.chunks.reassembly import ReassemblyStats
from edgefl.wire.crc import crc32

log = logging.getLogger(__name__)


class Outgoing:
    """One message being sent in chunks to one destination."""

    def __init__(
        self,
        dest: str,
        data: bytes,
        message_id: bytes,
        chunk_size: int,
        on_done: Callable[[bool], None] | None = None,
    ):
        if len(message_id) != 16:
            raise ValueError("a chunked message's id is 16 bytes")
        self.dest, self.data, self.message_id, self.chunk_size = (
            dest,
            memoryview(data),
            message_id,
            chunk_size,
        )
        self.total = len(data)
        self.count = math.ceil(self.total / chunk_size)
        self.crc = crc32(self.data)
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
        return (
            ChunkHeader(
                self.message_id,
                i,
                self.count,
                self.total,
                self.chunk_size,
                self.crc,
                crc32(body),
            ).pack()
            + body
        )

    def size(self, i: int) -> int:
        return min(self.chunk_size, self.total - i * self.chunk_size)

    @property
    def inflight_bytes(self) -> int:
        return sum(self.size(i) for i in self.unacked)

    def ack(self, nxt: int, bitmap: int) -> int:
        """Apply an acknowledgement; the newly acknowledged bytes."""
        newly = 0
        for i in [
            i for i in self.unacked if i < nxt or (i > nxt and (bitmap >> (i - nxt - 1)) & 1)
        ]:
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
        # the longest recent wait between two acknowledgements that made progress (decays)
        self.gap = 0.0
        self._rate_mark: tuple[float, int] | None = None
        self._acked_total = 0
        self.stats = SendStats()
        self.stopping = False
        self.thread: threading.Thread | None = None
        self.use_timer, self.name = timer, name

    # -- the caller's side --
    def send(
        self,
        dest: str,
        data: bytes,
        message_id: bytes,
        on_done: Callable[[bool], None] | None = None,
    ) -> Outgoing:
        """Start sending ``data`` to ``dest`` (a topic); ``on_done(ok)`` when it is acknowledged
        whole (True) or refused / given up (False). A message already being sent to ``dest`` is left
        going."""
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
                    log.warning(
                        "%s: giving up on a %d-byte message to %s after %d stalls",
                        self.name,
                        out.total,
                        out.dest,
                        out.stalls - 1,
                    )
                    self._release(out, "given up")
                    self.stats.given_up += 1
                    done.append(out)
                    continue
                out.last_progress = now  # the re-sent chunks get their own time to arrive
                for i in sorted(out.unacked):
                    batch.append((out.dest, out.chunk(i)))
                    out.resent += 1
                    self.stats.resent += 1
                log.info(
                    "%s: no progress on a message to %s for %.1f s; re-sending %d chunks",
                    self.name,
                    out.dest,
                    self.stall_time(out),
                    len(out.unacked),
                )
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
        return min(
            s.max_stall, (max(s.stall_after, 2 * self.gap) + self.inflight / rate) * (2**out.stalls)
        )

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            self.lock.notify_all()
        join_timer(self.thread)

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
                if (
                    out.state != "sending"
                    or out.sent_upto >= out.count
                    or per_dest[out.dest] >= s.window
                ):
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


def split(data: bytes, message_id: bytes, chunk_size: int) -> list[bytes]:
    """Every chunk of ``data`` (for tests and small callers; :class:`Outgoing` builds them
    lazily)."""
    out = Outgoing("", data, message_id, chunk_size)
    return [out.chunk(i) for i in range(out.count)]


@dataclass
class ChunkCounters:
    """What an endpoint's chunk layer did, for run records and benchmarks."""

    sent: SendStats = field(default_factory=SendStats)
    received: ReassemblyStats = field(default_factory=ReassemblyStats)
