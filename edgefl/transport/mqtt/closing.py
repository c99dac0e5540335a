"""The end of an exchange, acknowledged: :class:`DeferredCloses`, the server's closing broadcasts
held back for ``delay`` seconds and dropped when the next request to each device of the exchange
went out first (the protocol is described in :mod:`edgefl.transport.mqtt`).

A device takes a new request as the acknowledgement of every reply it sent before: the server
keeps one request open per device, so when it sends a device a new request it has that device's
earlier replies or no longer wants them, which is what the closing broadcast says. In a run
whose rounds follow each other within ``delay``, no exchange but the last needs its broadcast:
one message fewer for the server to publish and, more, one message fewer for every device to
receive and check per round.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)


class DeferredCloses:
    """Closing broadcasts due ``delay`` seconds after their exchange closed, unless every device
    of the exchange has been sent a new request by then (:meth:`requested`). ``announce(kind,
    round)`` publishes one; it runs on this object's thread (started at the first close), or in
    :meth:`flush`. ``delay`` 0: each is announced at once."""

    def __init__(self, announce: Callable[[str, int], None], delay: float, name: str):
        self.announce, self.delay, self.name = announce, delay, name
        self.wake = threading.Condition()
        # (kind, round) → (due, devices not yet sent a new request)
        self.due: dict[tuple[str, int], tuple[float, set[str]]] = {}
        self.sleeping_until = math.inf  # when the thread wakes by itself (inf: when notified)
        self.thread: threading.Thread | None = None
        self.stopping = False

    def close(self, kind: str, rnd: int, devices: Iterable[str]) -> None:
        """The (kind, round) exchange with ``devices`` is over."""
        devices = set(devices)
        if not devices:
            return
        if self.delay <= 0:
            self.announce(kind, rnd)
            return
        with self.wake:
            if not self.stopping:
                old = self.due.get((kind, rnd))
                due = time.monotonic() + self.delay if old is None else old[0]
                self.due[(kind, rnd)] = (due, devices | (old[1] if old else set()))
                if self.thread is None:
                    self.thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                    self.thread.start()
                elif due < self.sleeping_until:  # else it wakes in time by itself
                    self.wake.notify()
                return
        self.announce(kind, rnd)  # stopping: at once

    def requested(self, device_id: str) -> None:
        """A request went to ``device_id``: it acknowledges the device's earlier replies."""
        if not self.due:  # the common case of a run's first exchange, or a quiet fleet
            return
        with self.wake:
            for key in list(self.due):
                devices = self.due[key][1]
                devices.discard(device_id)
                if not devices:
                    del self.due[key]

    def flush(self) -> None:
        """Announce every exchange still waiting, now (before the end of a run, or stopping)."""
        with self.wake:
            keys = sorted(self.due)
            self.due.clear()
        for kind, rnd in keys:
            self.announce(kind, rnd)

    def stop(self, flush: bool = True) -> None:
        with self.wake:
            self.stopping = True
            self.wake.notify_all()
        if flush:
            self.flush()

    def _run(self) -> None:
        while True:
            with self.wake:
                while True:
                    if self.stopping:
                        return
                    now = time.monotonic()
                    ready = sorted(key for key, (due, _) in self.due.items() if due <= now)
                    if ready:
                        break
                    self.sleeping_until = min((due for due, _ in self.due.values()),
                                              default=math.inf)
                    self.wake.wait(None if self.sleeping_until == math.inf
                                   else self.sleeping_until - now)
                    self.sleeping_until = math.inf
                for key in ready:
                    del self.due[key]
            for kind, rnd in ready:
                try:
                    self.announce(kind, rnd)
                except Exception:  # noqa: BLE001 - the next exchange's close must still go out
                    log.exception("could not announce the close of %s round %d", kind, rnd)
