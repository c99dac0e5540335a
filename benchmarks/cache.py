"""The cell cache and the parallel run of cells (../shared/specs/BENCHMARKS.md, "The runner").

Finished cells are cached as ``<benchmark>/cells/<key>-<code hash>.json``: the key a hash of the
cell's full configuration (:attr:`benchmarks.cells.Cell.key`), the code hash one of the code the
cell runs (:mod:`benchmarks.provenance`), so an interrupted benchmark resumes, a finished one is
only re-reported and a code change never reuses a cell. :func:`run_cells` runs the missing cells in
worker processes (each on one torch thread) and refuses to run a cell from code that differs from
its commit unless the cache is a draft's (``--draft``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks import provenance
from benchmarks.cells import Cell, _worker_init, legacy_curve, new_invocation, run_cell
from edgefl.report.recorder import json_safe
from edgefl.runtime.processes import preloaded_context

#: the commit (``+dirty`` where the code differs from it) a measurement runs at: the timing
#: benchmarks' record
code_version = provenance.code_version


#: Hooks moved out of their benchmark's ``__init__`` into its ``extras`` module (issue 37: the
#: code hash covers the hook's module, and the grid and page text beside the hook made every edit of
#: the page a code change): old name -> new name, so that records cached under the old name (never
#: rewritten) still count as made by the hook. Reports keep reading them; a run never reuses them,
#: since their code hash is that of the old module (:meth:`Cache.get` reads only the current one).
MOVED_HOOKS = {
    "benchmarks.hierarchyfl:extras": "benchmarks.hierarchyfl.extras:extras",
    "benchmarks.fedhenn:extras": "benchmarks.fedhenn.extras:extras",
    "benchmarks.fedvtc:extras": "benchmarks.fedvtc.extras:extras",
    "benchmarks.time_to_accuracy:clock_extras": "benchmarks.time_to_accuracy.extras:extras",
}


class DirtyCode(RuntimeError):
    """Cells would run from code that differs from its commit (``--draft`` allows it)."""


class Cache:
    """Finished cells as JSON files named ``<key>-<code hash>.json`` (:mod:`benchmarks.provenance`).

    :meth:`get` (what a run reuses) answers only a record of the same configuration *and* code,
    never a draft unless the cache is a draft's; :meth:`find` (what a report reads) also answers
    one from other code, newest first, and last a record cached before code hashes existed
    (``<key>.json``, pre-provenance), each marked so on the page. With ``record_extras`` a record
    made without that hook is a miss (it lacks the metrics the claims name)."""

    def __init__(
        self,
        directory: Path,
        record_extras: str | None = None,
        *,
        code_hash: str | None = None,
        draft: bool = False,
    ):
        self.dir = Path(directory)
        self.record_extras = record_extras
        self.code_hash = code_hash or provenance.code_hash(record_extras)
        self.draft = draft

    def path(self, cell: Cell) -> Path:
        return self.dir / f"{cell.key}-{self.code_hash}.json"

    def _load(self, cell: Cell, path: Path) -> dict | None:
        record = json.loads(path.read_text())
        hook = record.get("extras_from")
        if MOVED_HOOKS.get(hook, hook) != self.record_extras:
            return None
        # computed from another version of a file the configuration names (a fleet file)
        if not provenance.inputs_match(cell.config, record):
            return None
        # the same configuration run for another label (a sweep value that is also a grid cell)
        return {**legacy_curve(record), "method": cell.method, "setting": cell.setting,
                "role": cell.role}

    def get(self, cell: Cell) -> dict | None:
        p = self.path(cell)
        if not p.exists():
            return None
        record = self._load(cell, p)
        if record is not None and record.get("draft") and not self.draft:
            return None
        return record

    def find(self, cell: Cell) -> dict | None:
        hit = self.get(cell)
        if hit is not None:
            return hit
        others = [self._load(cell, p) for p in self.dir.glob(f"{cell.key}-*.json")]
        others = sorted((r for r in others if r is not None and (self.draft or not r.get("draft"))),
                        key=lambda r: r.get("finished_at", ""), reverse=True)
        if others:
            return others[0]
        legacy = self.dir / f"{cell.key}.json"
        return self._load(cell, legacy) if legacy.exists() else None

    def put(self, cell: Cell, record: dict) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.path(cell).with_suffix(".tmp")
        tmp.write_text(json.dumps(json_safe(record), indent=1) + "\n")
        tmp.replace(self.path(cell))  # atomic: an interrupted write never leaves half a record


@contextmanager
def _printed_here(ctx) -> Iterator[Any]:
    """A queue for the pool's workers' progress lines, printed by this process until the block
    ends (after the pool's own end: every line its workers put is printed)."""
    lines = ctx.SimpleQueue()

    def relay() -> None:
        for line in iter(lines.get, None):
            print(line, flush=True)

    thread = threading.Thread(target=relay, daemon=True)
    thread.start()
    try:
        yield lines
    finally:
        lines.put(None)
        thread.join()


def run_cells(
    cells: Sequence[Cell],
    cache: Cache,
    *,
    workers: int,
    keep_server_metrics: Sequence[str] = (),
    log: Callable[[str], None] = lambda m: print(m, flush=True),
    tmp_root: Path | None = None,
    progress: bool = False,
    invocation: str | None = None,
) -> list[dict]:
    """Every cell's record, running the ones not in the cache (``workers`` processes at a time).
    Refuses (:class:`DirtyCode`) to run a cell from code that differs from its commit unless the
    cache is a draft's; run directories live under ``tmp_root`` while their cell runs. Every cell
    it runs records ``invocation`` (the benchmark invocation's id, :func:`new_invocation`; by
    default this call's own)."""
    invocation = invocation or new_invocation()
    records: dict[Cell, dict] = {}
    # one run per key: cells that spell one configuration differently share it
    todo, waiting = [], {}
    for cell in cells:
        hit = cache.get(cell)
        if hit is not None:
            records[cell] = hit
        elif cell.key in waiting:
            waiting[cell.key].append(cell)
        else:
            todo.append(cell)
            waiting[cell.key] = [cell]
    log(f"{len(cells)} cells: {len(records)} cached, {len(todo)} to run on {workers} worker(s)")
    version = provenance.code_version(cache.record_extras)
    changed_inputs = sorted({str(p) for c in todo for p in provenance.input_files(c.config)
                             if provenance.uncommitted(p)})
    if changed_inputs and not cache.draft:
        raise DirtyCode(
            f"{len(todo)} cells would run from files that differ from the commit: "
            f"{', '.join(changed_inputs)}. Commit them first, or ask for a draft (--draft)"
        )
    if todo and provenance.is_dirty(version) and not cache.draft:
        raise DirtyCode(
            f"{len(todo)} cells would run from code at {version}: the edgefl package or the "
            "benchmark's "
            "module differs from the commit. Commit first, or ask for a draft (--draft), whose "
            "cells are "
            "marked and never reused by a run that is not a draft"
        )
    if todo:
        t0 = time.perf_counter()
        # workers forked from the fork server that imported torch and edgefl once (spawn where the
        # platform has none), not fresh interpreters that import them again per pool; their
        # progress lines are printed here
        ctx = preloaded_context()
        here = os.getpid()  # the workers end with this process (benchmarks.cells._worker_init)
        with _printed_here(ctx) as lines, ProcessPoolExecutor(
            max_workers=workers, mp_context=ctx, initializer=_worker_init, initargs=(lines, here)
        ) as pool:
            tmp = None if tmp_root is None else str(tmp_root)
            pending = {
                pool.submit(
                    run_cell,
                    c,
                    tuple(keep_server_metrics),
                    cache.record_extras,
                    tmp,
                    progress,
                    cache.draft,
                    invocation,
                ): c
                for c in todo
            }
            done_count = 0
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    cell = pending.pop(fut)
                    # a failing cell stops the benchmark: it is a bug (a run that stopped, every
                    # device failing or every budget spent, is a record: cells.stopped_summary)
                    record = fut.result()
                    if record.get("code_hash") != cache.code_hash:
                        raise RuntimeError(
                            f"{cell.label}: the code changed while the benchmark ran (hash "
                            f"{record.get('code_hash')} against {cache.code_hash} at the start)"
                        )
                    cache.put(cell, record)
                    for same in waiting[cell.key]:
                        records[same] = cache.get(same)
                    done_count += 1
                    acc = record["final_accuracy"]
                    stop = (f", stopped at round {record['stopped_at_round']}: "
                            f"{record['stop_reason']}") if record.get("stopped_at_round") else ""
                    log(f"[{done_count}/{len(todo)}] {cell.label}: "
                        + ("no accuracy" if acc is None else f"{100 * acc:.2f}%")
                        + f"{stop} in {record['wall_seconds']:.0f}s "
                        f"({time.perf_counter() - t0:.0f}s elapsed)")
    return [records[c] for c in cells]
