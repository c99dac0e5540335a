"""Child processes that start without paying torch's import: a fork server that imported it once.

A fresh interpreter that imports torch, edgefl and ``torch._dynamo`` (which ``torch.optim`` imports
when the first optimizer is made) spends about 2.5 s of CPU before it trains anything; twenty device
processes on two cores spend most of a minute on it. :func:`preloaded_context` is a multiprocessing
context whose fork server (a fresh process, started on first use, that only imported these
modules: no torch thread pool exists yet, so forking it is safe, unlike forking a process that has
run torch) forks each child in milliseconds. Where the platform has no fork servers (Windows) it is
the ``spawn`` context. :func:`start_fork_server` starts it early, so that its imports run while
this process goes on, and may name datasets it decodes once for all its children.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
from collections.abc import Sequence
from multiprocessing.context import BaseContext

log = logging.getLogger(__name__)

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
    # a device process's target: each child unpickles it, which would import it (with the server
    # half of the runtime and the secure-aggregation crypto it imports) in every device
    "edgefl.runtime.fleet",
]
#: Imported last, after any preload: keeps the datasets KEEP_DATA_ENV names, then freezes the
#: fork server's heap (gc.freeze) for its children and its exit.
KEEP_DATA = "edgefl.runtime.forkwarm"

#: Set only while :func:`start_fork_server` starts the fork server: the datasets (a JSON list of
#: [name, data_dir]) it decodes once and keeps, for the processes it forks to read from memory.
KEEP_DATA_ENV = "EDGEFL_FORK_SERVER_DATA"


def has_fork_server() -> bool:
    return "forkserver" in multiprocessing.get_all_start_methods()


def preloaded_context(preload: Sequence[str] = PRELOAD) -> BaseContext:
    """The fork-server context whose server imports ``preload`` (default :data:`PRELOAD`) when it
    starts (the one fork server of this process: a running one keeps its imports), or ``spawn``
    where there is none."""
    if not has_fork_server():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([*preload, KEEP_DATA])
    return ctx


def start_fork_server(datasets: Sequence[tuple[str, str | None]] = (),
                      preload: Sequence[str] = PRELOAD) -> BaseContext:
    """Start this process's fork server now, without waiting for it: its imports of ``preload``
    (:data:`PRELOAD`: about 3 s of CPU) run beside this process's own work instead of before the
    first child. It decodes the IDX files of ``datasets`` ((name, data_dir) pairs) once and keeps
    them, so every child reads them from memory (:func:`edgefl.data.idx.keep_idx`). Returns
    :func:`preloaded_context`; where there are no fork servers nothing is started, and a running
    fork server keeps what it was started with."""
    ctx = preloaded_context(preload)
    if not has_fork_server():
        return ctx
    from multiprocessing import forkserver

    before = os.environ.get(KEEP_DATA_ENV)
    os.environ[KEEP_DATA_ENV] = json.dumps([[name, data_dir] for name, data_dir in datasets])
    try:
        forkserver.ensure_running()
    finally:
        if before is None:
            os.environ.pop(KEEP_DATA_ENV, None)
        else:
            os.environ[KEEP_DATA_ENV] = before
    return ctx


def keep_named_datasets() -> list[str]:
    """Keep the datasets that :data:`KEEP_DATA_ENV` names
    (:func:`edgefl.data.sources.keep_dataset`); returns those kept. What the fork server does
    last (:mod:`edgefl.runtime.forkwarm`); a dataset that cannot be read, or a malformed
    variable, is left to the children, which read it alone."""
    from edgefl.data.sources import keep_dataset

    kept: list[str] = []
    try:
        named = [(str(name), data_dir) for name, data_dir in
                 json.loads(os.environ.get(KEEP_DATA_ENV) or "[]")]
    except (ValueError, TypeError) as e:  # never stops the fork server
        log.warning("ignoring %s: %s", KEEP_DATA_ENV, e)
        return kept
    for name, data_dir in named:
        try:
            if keep_dataset(name, data_dir):
                kept.append(name)
        except Exception as e:  # noqa: BLE001 - the children read it themselves and say why
            log.warning("the fork server did not keep %s: %s", name, e)
    return kept
