"""Latency and churn for the link check (links.py) without netem: a user-space TCP proxy per
device, between the host end of its veth pair and the broker on loopback.

Latency: every byte read from either side is written to the other ``latency`` seconds later, in
order (an asyncio queue per direction; a byte that waits behind a slow write is not delayed
twice). tc (tbf) still shapes the rate on the veth, so a message of B bytes pays latency + B /
rate each way, as the fleet clock charges it. What it does not delay: the device's TCP handshake
and ACKs (its TCP runs over the veth, with the proxy's socket at the other end), so TCP's own
round trips cost nothing; links.md states why that does not matter here (the bandwidth-delay
product is far below TCP's window).

Churn: the proxy follows the device's availability timeline (the FleetClock's, from the same
fleet file and seed) from the instant ``start(t0)`` names. When the timeline turns offline, the
device's connections are cut at both ends (reset: the broker publishes its Last Will at once);
while offline, a new connection is held unanswered, as a TCP handshake on a dead Wi-Fi link
would be: nothing reaches the broker, and it goes through when the device is back (or is dropped
if the device gives up on it first). Before ``start`` the device is online.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable
from typing import Any

Online = Callable[[float], tuple[bool, float]]  # t → (online at t, when that changes)


class DelayProxy:
    """One device's proxy: ``listen`` (host, port) → ``upstream`` (host, port)."""

    def __init__(
        self,
        name: str,
        listen: tuple[str, int],
        upstream: tuple[str, int],
        latency_s: float,
        timeline: Online,
    ):
        self.name, self.listen, self.upstream = name, listen, upstream
        self.latency, self.timeline = latency_s, timeline
        self.t0: float | None = None  # monotonic start of the timeline
        self.following = False
        self.online = asyncio.Event()
        self.online.set()
        self.conns: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter | None]] = set()
        # (seconds since t0, "offline"/"online"/"connected", connections cut)
        self.events: list[tuple[float, str, int]] = []
        self.server: asyncio.base_events.Server | None = None
        self.driver: asyncio.Task | None = None

    async def open(self) -> None:
        self.server = await asyncio.start_server(self._serve, *self.listen)

    def start(self, t0: float) -> None:
        """(event loop) Follow the timeline from ``t0`` (time.monotonic())."""
        self.t0, self.following = t0, True
        self.driver = asyncio.ensure_future(self._drive())

    def stop_following(self) -> None:
        """(event loop) Online from now on (the run is over: devices hear that it ended)."""
        self.following = False
        if self.driver is not None:
            self.driver.cancel()
        self.online.set()

    async def _drive(self) -> None:
        while self.following:
            t = time.monotonic() - self.t0
            on, change = self.timeline(t)
            if on and not self.online.is_set():
                self.online.set()
                self.events.append((t, "online", 0))
            elif not on and self.online.is_set():
                self.online.clear()
                cut = self._cut_all()
                self.events.append((t, "offline", cut))
            if math.isinf(change):
                return
            await asyncio.sleep(max(0.0, change - (time.monotonic() - self.t0)) + 1e-3)

    def _cut_all(self) -> int:
        conns, self.conns = list(self.conns), set()
        for down, up in conns:
            for w in (down, up):
                if w is not None:
                    w.transport.abort()  # a reset, no DISCONNECT: the broker's Last Will speaks
        return len(conns)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held = bytearray()
        if not self.online.is_set():  # the handshake is held until the device is back
            gone = asyncio.ensure_future(self._read_while_held(reader, held))
            back = asyncio.ensure_future(self.online.wait())
            await asyncio.wait({gone, back}, return_when=asyncio.FIRST_COMPLETED)
            if gone.done() and gone.result():  # the device gave up on it
                back.cancel()
                writer.transport.abort()
                return
            gone.cancel()
            try:
                await gone
            except asyncio.CancelledError:
                pass
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            return
        pair = (writer, up_writer)
        self.conns.add(pair)
        if self.t0 is not None:  # when the device's connection reached the broker
            self.events.append((time.monotonic() - self.t0, "connected", 0))
        try:
            await asyncio.gather(
                self._pipe(reader, up_writer, bytes(held)),
                self._pipe(up_reader, writer, b""),
            )
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self.conns.discard(pair)
            for w in pair:
                w.transport.abort()

    @staticmethod
    async def _read_while_held(reader: asyncio.StreamReader, held: bytearray) -> bool:
        """True when the device closed the held connection."""
        while True:
            data = await reader.read(65536)
            if not data:
                return True
            held.extend(data)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, first: bytes):
        """src → dst, each chunk written ``latency`` after it was read, in order."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        if first:
            queue.put_nowait((time.monotonic() + self.latency, first))

        async def read() -> None:
            while True:
                data = await src.read(65536)
                queue.put_nowait((time.monotonic() + self.latency, data))
                if not data:
                    return

        reading = asyncio.ensure_future(read())
        try:
            while True:
                due, data = await queue.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    if dst.can_write_eof():
                        dst.write_eof()
                    return
                dst.write(data)
                await dst.drain()
        finally:
            reading.cancel()


class Proxies:
    """The proxies of a fleet on one event loop in a thread: ``with Proxies(...) as p``."""

    def __init__(self, proxies: list[DelayProxy]):
        self.proxies = {p.name: p for p in proxies}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="link-proxies",
                                       daemon=True)

    def _call(self, fn: Callable[[], Any]) -> Any:
        done = threading.Event()
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = fn()
            except BaseException as e:  # handed to the caller's thread
                box["error"] = e
            done.set()

        self.loop.call_soon_threadsafe(run)
        done.wait()
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def __enter__(self) -> Proxies:
        self.thread.start()
        for p in self.proxies.values():
            asyncio.run_coroutine_threadsafe(p.open(), self.loop).result(30)
        return self

    def start(self, t0: float) -> None:
        """Every proxy follows its timeline from ``t0`` (time.monotonic())."""
        self._call(lambda: [p.start(t0) for p in self.proxies.values()])

    def release(self) -> None:
        """Everyone online from now on."""
        self._call(lambda: [p.stop_following() for p in self.proxies.values()])

    def events(self) -> dict[str, list[tuple[float, str, int]]]:
        return self._call(lambda: {n: list(p.events) for n, p in self.proxies.items()})

    def __exit__(self, *exc: Any) -> None:
        def close() -> None:
            for p in self.proxies.values():
                p.stop_following()
                p._cut_all()
                if p.server is not None:
                    p.server.close()

        self._call(close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
