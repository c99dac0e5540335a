"""A device stopped by SIGTERM or Ctrl-C leaves the broker cleanly when it can, and exits within
``edgefl.runtime.interrupt.LEAVE_GRACE`` seconds when it cannot (a test once waited 30 s for a
device that never exited: the KeyboardInterrupt that SIGTERM raises can land inside the
Python-level locking of ``queue.Queue`` or ``threading.Condition``)."""

import signal
import subprocess
import sys

from tests.conftest import scaled

#: A process that serves until stopped, and whose clean leave cannot finish: the lock it needs was
#: left taken (as by a KeyboardInterrupt that landed between a lock's acquire and its ``with``).
STUCK_LEAVE = """
import threading
from edgefl.runtime.interrupt import leave_within

taken = threading.Lock()
taken.acquire()
with leave_within(grace={grace}):
    try:
        print("serving", flush=True)
        threading.Event().wait()
    finally:
        print("leaving", flush=True)
        taken.acquire()  # the clean leave: waits forever
"""

def stopped(grace: float, *signals: signal.Signals) -> tuple[int, str, str]:
    """Start STUCK_LEAVE, and once it serves send it ``signals``, each after the line that says the
    last one was taken ("serving", then "leaving"): (exit status, the rest of stdout, stderr)."""
    code = STUCK_LEAVE.format(grace=grace)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        for expected, sig in zip(("serving", "leaving"), signals, strict=False):
            assert proc.stdout.readline().strip() == expected
            proc.send_signal(sig)
        out, err = proc.communicate(timeout=scaled(60))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, err


def test_a_device_whose_clean_leave_cannot_finish_exits_after_the_grace_saying_where_it_was():
    code, out, err = stopped(1.0, signal.SIGTERM)
    assert code == 130, err
    assert out.strip() == "leaving"  # the clean leave was tried first
    assert "still running 1 s after the signal to stop: exiting now" in err
    # every thread's stack (faulthandler), the main thread in the clean leave's line
    assert "most recent call first" in err and 'File "<string>", line 13' in err


def test_a_second_signal_during_the_leave_exits_at_once():
    code, _, err = stopped(600.0, signal.SIGINT, signal.SIGTERM)  # Ctrl-C, then SIGTERM
    assert code == 130
    assert "interrupted again: exiting now, without a clean leave" in err
    assert "still running" not in err


def test_outside_a_signal_the_block_changes_no_handler():
    from edgefl.runtime.interrupt import leave_within

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with leave_within(grace=1.0):
        inside = signal.getsignal(signal.SIGTERM)
    assert inside not in before
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
