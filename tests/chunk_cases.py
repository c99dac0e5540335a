"""What tests/test_chunks.py and tests/test_chunk_sender.py share: a manual clock, small chunk
settings, and a sender and a receiver joined by a lossy, reorderable network driven by hand."""

import os

from edgefl.transport.chunks import (
    ChunkSender,
    ChunkSettings,
    Reassembler,
)

MID = bytes(range(16))


MAX = 1 << 20


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def settings(**kw):
    base = dict(threshold=64, chunk_size=100, window=4, max_inflight_bytes=10_000,
                stall_after=1.0, assumed_rate=1e6, max_chunk_size=1000)
    return ChunkSettings(**{**base, **kw})


class Link:
    """A sender and a receiver joined by a lossy, reorderable, manually driven network."""

    def __init__(self, s=None, drop=None):
        self.clock = Clock()
        self.s = s or settings()
        self.wire: list[tuple[str, bytes]] = []  # chunks on the way to the receiver
        self.sender = ChunkSender(
            lambda topic, data: self.wire.append((topic, data)),
            self.s,
            clock=self.clock,
            timer=False,
        )
        self.receiver = Reassembler(self.s, max_bytes=MAX, clock=self.clock)
        self.drop = drop or (lambda topic, data: False)
        self.delivered: list[bytes] = []
        self.done: list[bool] = []

    def deliver(self, n=None, order=None):
        """Deliver ``n`` chunks on the wire (all by default), in ``order`` if given; acks go back at
        once."""
        batch, self.wire = (self.wire, []) if n is None else (self.wire[:n], self.wire[n:])
        if order is not None:
            order(batch)
        for topic, data in batch:
            if self.drop(topic, data):
                continue
            message, ack = self.receiver.add(topic, data)
            if message is not None:
                self.delivered.append(message)
            self.sender.on_ack(topic, ack)

    def run(self, data, dest="d/down", max_steps=1000, step=0.1):
        self.sender.send(dest, data, MID, on_done=self.done.append)
        for _ in range(max_steps):
            if self.done:
                return
            self.deliver()
            self.clock.t += step
            self.sender.poll()
        raise AssertionError("the transfer did not finish")


def add_all(r: Reassembler, sender: str, chunks) -> bytes | None:
    """Give ``r`` each of ``chunks`` from ``sender``: the message the last one completed (None:
    none did)."""
    message = None
    for c in chunks:
        message, _ = r.add(sender, c)
    return message


def payload(n):
    return os.urandom(n)
