"""Work slots: at most N device processes of one machine doing local work at once.

A simulated fleet over MQTT (``edgefl simulate --transport mqtt``, ``make demo``) runs one OS
process per device on one machine: 20 devices on 2 cores. Training all at once, they take turns
on the cores and each resumes with caches the others evicted: the same steps cost about a fifth
more CPU with 20 processes at once than with one, ~4 % more with two
(``benchmarks/demo/concurrent_training.md``). A device holding a slot while it trains,
evaluates or finishes, one slot per core, keeps that cost at the two-at-once level, as Flower's
simulation does with its per-client CPU resources. What a device computes does not change, only
when.

The slots are files in a folder (:func:`create_slots`); a device holds one with an exclusive
``flock`` on it, taken without blocking from whichever file is free, retried every few
milliseconds while none is. The kernel drops the lock when its holder's file is closed, so a
device that dies mid-round (killed, out of memory) gives its slot back with it. Each
:class:`WorkSlots` opens the files for itself: two agents in one process (the overhead
benchmark's device threads) hold slots apart, as two processes do.
"""

from __future__ import annotations

import fcntl
import os
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from edgefl.errors import ConfigError

PREFIX = "slot-"
#: retries while every slot is held: the first after 1 ms, doubling up to this
MAX_POLL_SECONDS = 0.02


def create_slots(folder: Path, count: int) -> Path:
    """``count`` slot files in ``folder`` (created; files already there are kept); returns it."""
    if count < 1:
        raise ConfigError(f"work slots: the count must be at least 1, got {count}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (folder / f"{PREFIX}{i}").touch()
    return folder


class WorkSlots:
    """The slots of ``folder`` as one holder sees them (its own open files)."""

    def __init__(self, folder: str | Path):
        files = sorted(Path(folder).glob(PREFIX + "*")) if Path(folder).is_dir() else []
        if not files:
            raise ConfigError(f"work slots: no {PREFIX}* files in {folder} (a folder that "
                              "create_slots made, or `edgefl simulate --transport mqtt` passes)")
        self.folder = Path(folder)
        self.fds = [os.open(f, os.O_RDWR | os.O_CLOEXEC) for f in files]
        self.rng = random.Random()  # which free slot to try first: no holder always wins slot 0
        self.waited = 0.0  # seconds spent waiting for a slot, in all

    def try_hold(self) -> int | None:
        """A free slot's file descriptor, now held; None if every slot is held."""
        start = self.rng.randrange(len(self.fds))
        for fd in self.fds[start:] + self.fds[:start]:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            return fd
        return None

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Wait for a free slot and hold it inside the block."""
        t0, pause = time.perf_counter(), 0.001
        while (fd := self.try_hold()) is None:
            time.sleep(pause)
            pause = min(2 * pause, MAX_POLL_SECONDS)
        self.waited += time.perf_counter() - t0
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []
