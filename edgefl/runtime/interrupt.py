"""Ctrl-C while a run writes what it has: a second Ctrl-C exits at once.

    try:
        run_rounds()
    except KeyboardInterrupt:
        with second_interrupt_exits():
            write_the_record()

The first Ctrl-C (SIGINT, or SIGTERM, which ``edgefl`` turns into one) ends the rounds; the run
then writes its record (rounds, summary, plots, models so far), which may take seconds. Inside
this block a second SIGINT or SIGTERM ends the process at once with exit status 130, saying so.

A device leaves within a bound (:func:`leave_within`): the KeyboardInterrupt that a signal raises
lands between two bytecodes of whatever the main thread runs, which may be the Python-level lock
code of ``queue.Queue`` or ``threading.Condition`` (its lock then taken and not given back, or
given back for another thread), and a clean leave that needs that lock, or joins a thread that
does, would wait forever. So the first signal also starts a clock: the process ends ``grace``
seconds later whatever it is doing, with the stack of every thread on stderr.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from edgefl.errors import ExitCode

#: Seconds a device has, after Ctrl-C or SIGTERM, to leave the broker cleanly before it exits
#: anyway (deploy/edgefl-device.service allows 30 before SIGKILL, ``docker stop`` 10).
LEAVE_GRACE = 8.0


def _exit_now(signum, frame) -> None:
    try:
        sys.stderr.write("\ninterrupted again: exiting now; the run's record may be incomplete\n")
        sys.stderr.flush()
    finally:
        os._exit(int(ExitCode.INTERRUPTED))


@contextmanager
def second_interrupt_exits() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread receives signals
        return
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in before:
        signal.signal(sig, _exit_now)
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


class _Watchdog:
    """A thread, started before any signal comes, that ends the process ``grace`` seconds after
    :meth:`arm`. A signal handler arms it with one ``os.write`` to a pipe: no lock is taken, where
    setting a ``threading.Event`` would take one that the interrupted main thread may hold."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        self.grace = LEAVE_GRACE
        self.armed = False
        try:  # the process's own stderr, also when something has replaced sys.stderr since
            self.err_fd = sys.__stderr__.fileno()
        except (AttributeError, OSError, ValueError):
            self.err_fd = 2
        threading.Thread(target=self._run, name="edgefl-leave-watchdog", daemon=True).start()

    def arm(self, grace: float) -> None:
        self.grace, self.armed = grace, True
        os.write(self.write_fd, b"!")

    def _run(self) -> None:
        os.read(self.read_fd, 1)
        time.sleep(self.grace)
        # os.write and faulthandler write to the descriptor: a stuck main thread may hold the lock
        # of sys.stderr's buffer
        note = (f"\nstill running {self.grace:g} s after the signal to stop: exiting now "
                "without a clean leave (the broker publishes this device's Last Will); "
                "where each thread was:\n")
        try:
            os.write(self.err_fd, note.encode())
            faulthandler.dump_traceback(file=self.err_fd, all_threads=True)
        finally:
            os._exit(int(ExitCode.INTERRUPTED))


_watchdog: list[_Watchdog] = []  # one per process, started on first use


@contextmanager
def leave_within(grace: float = LEAVE_GRACE) -> Iterator[None]:
    """Inside this block, Ctrl-C or SIGTERM raises KeyboardInterrupt (so ``finally`` blocks leave
    the broker cleanly) and the process exits with status 130 ``grace`` seconds later if it has
    not ended by then (the stack of every thread on stderr); a second signal exits at once.
    Outside the main thread, or once the block is left without a signal, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if not _watchdog:
        _watchdog.append(_Watchdog())
    watchdog = _watchdog[0]
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def first(signum, frame) -> None:
        for sig in before:
            signal.signal(sig, again)
        watchdog.arm(grace)
        raise KeyboardInterrupt

    def again(signum, frame) -> None:
        try:
            os.write(watchdog.err_fd, b"\ninterrupted again: exiting now, without a clean leave\n")
        finally:
            os._exit(int(ExitCode.INTERRUPTED))

    for sig in before:
        signal.signal(sig, first)
    try:
        yield
    finally:
        if not watchdog.armed:  # (once armed, the process is on its way out)
            for sig, handler in before.items():
                signal.signal(sig, handler)
