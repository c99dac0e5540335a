"""A process that holds a fleet in memory returns what its devices free, without making
every training step pay for it.

glibc serves an allocation of at least its mmap threshold (128 KiB at the start) with a mapping
of its own, unmapped when freed; freeing such a block (up to 32 MiB) raises the threshold to its
size and the trim threshold (the free space at the heap's top past which ``free`` shrinks the
heap, 128 KiB at the start) to twice that. After the first training step a device's activations,
weights and uplinks all come from the heap, where the blocks freed between those still held
(every device's weights) are not given back: 1,000 CNN devices in memory, one FedAvg round,
peaked at 1.71 and 3.94 GB in two runs (the holes are not the same from run to run). Setting
the threshold with ``mallopt`` (or ``MALLOC_MMAP_THRESHOLD_``; so too the trim threshold) stops
both from moving, the trim threshold where it stood (128 KiB in a fresh process).

:func:`fixed_mmap_threshold` pins the threshold at 64 KiB (under the CNN's 125 kB classifier):
1.49 GB. But then every activation and gradient of 64 KiB or more of every training step is an
mmap and a munmap with fresh zeroed pages: FedAvg on 10 CNN devices, three rounds of 19 steps,
took 23.4 CPU s pinned (9.7 s of it in the kernel, 5.7 M page faults) against 13.4 s (0.9 s,
0.29 M) with glibc's dynamic threshold.

:func:`fleet_heap` keeps the dynamic threshold and calls ``malloc_trim(0)`` after each exchange
of a device, which hands the free pages inside the heap back (``madvise``) without moving
anything: a training step reuses the heap, and each device's holes are given back once an
exchange. Measured side by side (``benchmarks/scale/heap_policy.md``, CPU user + system):

- 10 CNN devices, 3 rounds: trimmed 13.4 s and 919 MB peak; pinned 23.4 s, 915 MB; dynamic
  13.4 s, 959 MB. Velo on 10 ResNet devices: 7.0, 7.4 and 6.7 s; 773, 780 and 784 MB.
- 1,000 CNN devices, one round of one step: trimmed 36.2 s, 1.52 GB; pinned 41.5 s, 1.49 GB;
  dynamic 23.7 s, 1.71 GB (3.94 GB in another run). 3,000: trimmed 68.6 s, 2.85 GB; pinned
  80.5 s, 2.87 GB.

The trim walks the heap's free chunks, which grow with the fleet; it was measured up to 3,000
devices, so from :data:`FLEET` devices (where ``benchmarks/scale/devices.py`` ran its 10,000
devices, pinned) the threshold is pinned instead. Elsewhere than glibc nothing changes.

On a large fleet a trim therefore costs milliseconds, and trims are held to :data:`TRIM_SHARE`
of the time: 1,000 CNN devices, one round of one step, took 48.8 CPU s trimming after each
exchange and 43.4 with the share, at the same peak (1,524 and 1,536 MB; never trimmed: 37.9 s
and 3,562 MB; ``benchmarks/scale/heap_trim_share.md``).

A trim costs tens of microseconds even on a small heap (41 µs CPU a call, 10 bench-echo devices
in memory: ``benchmarks/overhead/investigations/memory_round.py``), more than a whole exchange
of a device that does no local work. So an exchange is followed by a trim once
:data:`TRIM_INTERVAL` has passed since the last trim ended: every exchange of real local work
(a training step takes longer) still trims, and exchanges shorter than that (the overhead
benchmark's echo, an evaluation answered from the cache) share one trim per interval, which
leaves at most the memory those freed in that time resident until it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import sys
import time
from collections.abc import Callable
from typing import TypeVar

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
THRESHOLD = 64 * 1024
#: Devices held in one process from which :func:`fleet_heap` pins the threshold.
FLEET = 5000
#: An exchange ending sooner than this after the last trim ended is not followed by one.
TRIM_INTERVAL = 0.002
#: The most of a process's time trims may take: after a trim that took t seconds, the next waits
#: until t·(1 − share)/share seconds have passed (and :data:`TRIM_INTERVAL`). A trim walks the
#: heap's free chunks, so its cost grows with the fleet: 6 ms a trim at 1,000 CNN devices, where
#: a device's exchange (two training steps) takes about 15, so trimming after every exchange was
#: a quarter of the run's CPU (a 2-round DP-FedAvg cell of benchmarks/privacy's fleet1000: 48.8
#: CPU s against 36.7 untrimmed); on 10 devices a trim takes tens of microseconds and every
#: exchange of real local work still trims.
TRIM_SHARE = 0.05
H = TypeVar("H", bound=Callable)


def fleet_heap(
    devices: int,
    *,
    interval: float = TRIM_INTERVAL,
    share: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Callable[[H], H]:
    """Set this process's heap up for ``devices`` devices held in memory; returns how to wrap
    each device's message handler. From :data:`FLEET` devices the threshold is pinned
    (:func:`fixed_mmap_threshold`) and handlers stay as they are; below, glibc keeps its
    dynamic threshold (a training step reuses the heap) and an exchange of a device is followed
    by ``malloc_trim(0)``, which gives the free pages inside the heap back, once ``interval``
    seconds have passed since the last trim ended (``clock``'s) and trims would take no more
    than ``share`` (default :data:`TRIM_SHARE`; 1: no such limit) of the time."""
    if devices >= FLEET and fixed_mmap_threshold():
        return _as_is
    trim = malloc_trim()
    if trim is None:
        return _as_is
    share = TRIM_SHARE if share is None else share
    if not 0.0 < share <= 1.0:
        raise ValueError(f"a trim's share of the time is in (0, 1], got {share}")
    # one heap, every device's handler: when the last trim ended, and the wait it earned
    last, wait = [-float("inf")], [interval]

    def trimming(handler: H) -> H:
        @functools.wraps(handler)
        def handle(*args):
            try:
                return handler(*args)
            finally:
                if clock() - last[0] >= wait[0]:
                    started = clock()
                    trim(0)
                    last[0] = clock()
                    wait[0] = max(interval, (last[0] - started) * (1.0 - share) / share)

        return handle  # type: ignore[return-value]

    return trimming


def _as_is(handler: H) -> H:
    return handler


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (None elsewhere)."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def fixed_mmap_threshold(threshold: int = THRESHOLD) -> bool:
    """Pin glibc's mmap threshold at ``threshold`` bytes (which stops its growth); whether it
    was set (False where the C library is not glibc)."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:  # not Linux, musl and others: no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = bool(mallopt(M_MMAP_THRESHOLD, threshold))
    if not ok:
        log.debug("mallopt(M_MMAP_THRESHOLD, %d) refused", threshold)
    return ok
