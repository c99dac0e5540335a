"""Child processes that start without paying torch's import: a fork server that imported it once.

A fresh interpreter that imports torch, edgefl and ``torch._dynamo`` (which ``torch.optim`` imports
when the first optimizer is made) spends about 2.5 s of CPU before it trains anything; twenty device
processes on two cores spend most of a minute on it. :func:`preloaded_context` is a multiprocessing
context whose fork server (a fresh process, started on first use, that only imported these
modules: no torch thread pool exists yet, so forking it is safe, unlike forking a process that has
run torch) forks each child in milliseconds. Where the platform has no fork servers (Windows) it is
the ``spawn`` context.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.context import BaseContext

#: What the fork server imports before it forks: torch, its lazily imported compiler front end
#: (2.5 s of CPU at the first optimizer, measured), and the modules a device or worker runs.
PRELOAD = [
    "edgefl.cli.main",  # first: it sets OMP_WAIT_POLICY before torch is imported
    "torch",
    "torch._dynamo",
    "edgefl.algorithms",
    "edgefl.data",
    "edgefl.models",
    "edgefl.runtime.agent",
    "edgefl.runtime.device",
    "edgefl.runtime.parallel",
]


def has_fork_server() -> bool:
    return "forkserver" in multiprocessing.get_all_start_methods()


def preloaded_context() -> BaseContext:
    """The fork-server context with :data:`PRELOAD` (the one fork server of this process), or
    ``spawn`` where there is none."""
    if not has_fork_server():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx
