"""What every stability sweep (a benchmark's recipe chosen on a validation split, issue 37) does
around its own rule: its cells' records, run or read from the cache, the commits they ran at, and
the machine before and after (a ``--report-only`` rewrite keeps the ones its results file
recorded)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from benchmarks.cache import Cache, DirtyCode, run_cells
from benchmarks.cells import Cell
from benchmarks.common import machine


def records(every: Sequence[Cell], cache: Cache, *, report_only: bool, workers: int,
            tmp_root: Path, run: Sequence[Cell] | None = None) -> list[dict | None]:
    """Each cell's record (None: not run), after running the cells of ``run`` (every cell by
    default) that the cache lacks, unless ``report_only``; a refusal to run from uncommitted code
    ends the process with its message."""
    if not report_only:
        try:
            run_cells(every if run is None else run, cache, workers=max(1, workers),
                      tmp_root=tmp_root)
        except DirtyCode as e:
            raise SystemExit(str(e)) from None
    return [cache.find(c) for c in every]


def commits(done: Sequence[dict]) -> dict[str, int]:
    """{commit (``+dirty`` where the code differed): cells run at it}, in first-seen order."""
    return dict(Counter(r.get("code", "unknown") for r in done))


def _recorded(results: Path) -> dict:
    return json.loads(results.read_text()).get("machine", {}) if results.exists() else {}


def machine_before(results: Path) -> dict:
    """The machine when the sweep started, as its results file recorded it, else as it is now
    (call it before running)."""
    return _recorded(results).get("before") or machine()


def machine_after(results: Path, report_only: bool) -> dict:
    """The machine now (call it after running), or as recorded for a ``--report-only`` rewrite."""
    recorded = _recorded(results)
    return recorded["after"] if report_only and recorded.get("after") else machine()
