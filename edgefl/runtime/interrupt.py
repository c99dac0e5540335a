"""Ctrl-C while a run writes what it has: a second Ctrl-C exits at once.

    try:
        run_rounds()
    except KeyboardInterrupt:
        with second_interrupt_exits():
            write_the_record()

The first Ctrl-C (SIGINT, or SIGTERM, which ``edgefl`` turns into one) ends the rounds; the run
then writes its record (rounds, summary, plots, models so far), which may take seconds. Inside
this block a second SIGINT or SIGTERM ends the process at once with exit status 130, saying so.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from edgefl.errors import ExitCode


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
