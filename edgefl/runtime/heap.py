"""A process that holds a fleet in memory returns what its devices free.

glibc serves an allocation of at least its mmap threshold (128 KiB) with its own mapping, given
back to the system when freed, but raises that threshold to the size of each such block freed
(up to 32 MiB): after the first round's activations and uplinks are freed, a device's weights,
uplinks and activations all come from the heap, where the blocks freed between the ones still
held (every device's weights) are not given back. :func:`fixed_mmap_threshold` pins the threshold
at 64 KiB (below the CNN's 125 kB classifier, so its weights and uplinks get mappings of their
own too). Measured on 1,000 CNN devices in memory, one FedAvg round: peak 1.94 GB without it,
1.49 GB with it; after the round 1.75 GB against 1.22 GB. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import sys
from collections.abc import Callable
from typing import TypeVar

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
THRESHOLD = 64 * 1024
#: Devices held in one process from which :func:`fleet_heap` pins the threshold.
FLEET = 1000
H = TypeVar("H", bound=Callable)


def fleet_heap(devices: int) -> Callable[[H], H]:
    """Set this process's heap up for ``devices`` devices held in memory; returns how to wrap
    each device's message handler. From :data:`FLEET` devices the threshold is pinned
    (:func:`fixed_mmap_threshold`) and handlers stay as they are; below, glibc keeps its
    dynamic threshold (a training step reuses the heap) and every exchange of a device is
    followed by ``malloc_trim(0)``, which gives the free pages inside the heap back."""
    if devices >= FLEET and fixed_mmap_threshold():
        return _as_is
    trim = malloc_trim()
    if trim is None:
        return _as_is

    def trimming(handler: H) -> H:
        @functools.wraps(handler)
        def handle(*args):
            try:
                return handler(*args)
            finally:
                trim(0)

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
