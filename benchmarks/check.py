"""The reviewer's check (``python -m benchmarks.<name> --cells A,B --setting S --seeds 1,2,3
--out DIR``): the methods' cells of one setting run again with seeds of the reviewer's choosing,
into a folder of their own, and the verdict of every claim between those methods in that
setting."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks import gates, provenance
from benchmarks.cache import Cache, run_cells
from benchmarks.cells import Cell
from benchmarks.claims import KINDS, evaluate_claim
from edgefl.report.recorder import json_safe

if TYPE_CHECKING:
    from benchmarks.runner import Benchmark


def reviewer_cells(
    bench: Benchmark, methods: Sequence[str], setting: str, seeds: Sequence[int]
) -> list[Cell]:
    """The reviewer's check: the grid cells of ``methods`` in ``setting``, each with ``seeds``
    instead of the benchmark's (the same configuration otherwise)."""
    grid = [c for c in bench.cells if c.setting == setting]
    if not grid:
        raise SystemExit(f"setting {setting!r} is not in {bench.name}'s grid; its settings: "
                         + ", ".join(dict.fromkeys(c.setting for c in bench.cells)))
    cells = []
    for method in methods:
        template = next((c for c in grid if c.method == method), None)
        if template is None:
            raise SystemExit(
                f"method {method!r} has no cell in {setting}; there: "
                + ", ".join(dict.fromkeys(c.method for c in grid))
            )
        cells += [Cell(method, setting, seed, template.config, template.role) for seed in seeds]
    return cells


def check(
    bench: Benchmark,
    methods: Sequence[str],
    setting: str,
    seeds: Sequence[int],
    out: Path,
    *,
    workers: int,
    draft: bool = False,
) -> dict[str, Any]:
    """Run the reviewer's cells into ``out`` (``out/cells``, temporary files under ``out/tmp``) and
    evaluate every claim of the benchmark between the chosen methods in that setting over them
    (collapse gates included; the bounds are not rerun). Writes ``out/check.json``; prints the
    verdicts."""
    cells = reviewer_cells(bench, methods, setting, seeds)
    cache = Cache(out / "cells", bench.record_extras, draft=draft)
    runs = run_cells(cells, cache, workers=workers, keep_server_metrics=bench.keep_server_metrics,
                     tmp_root=out / "tmp", progress=True)
    claims = [
        c for c in bench.claims if c.setting == setting and set(c.parse()[::2]) <= set(methods)
    ]
    # the bounds are not rerun: only the collapse gate applies
    gate = {"collapsed": gates.collapsed_runs(runs)}
    verdicts = [evaluate_claim(c, runs, collapsed=gate["collapsed"]) for c in claims]
    keys = ("method", "setting", "seed", "final_accuracy", "code", "stopped_at_round",
            "stop_reason")
    result = {"benchmark": bench.name, "setting": setting, "methods": list(methods),
              "seeds": list(seeds), "code": provenance.code_version(bench.record_extras),
              "code_hash": cache.code_hash, "gates": gate, "claims": verdicts,
              "runs": [{k: r.get(k) for k in keys} for r in runs]}
    (out / "check.json").write_text(json.dumps(json_safe(result), indent=1) + "\n")
    for r in runs:
        acc = r["final_accuracy"]
        stop = (f" (stopped at round {r['stopped_at_round']}: {r['stop_reason']})"
                if r.get("stopped_at_round") else "")
        print(f"{r['method']:>20} seed {r['seed']}: "
              + ("no accuracy" if acc is None else f"{100 * acc:.2f} %") + stop)
    if not verdicts:
        print(f"no claim of {bench.name} compares only {', '.join(methods)} in {setting}")
    for c in verdicts:
        print(
            f"{c['verdict']:>15}: {c['statement']} [{c['setting']}] ({KINDS[c['kind']]}): "
            f"{c['reason']}"
        )
    print(f"check: {out / 'check.json'}")
    return result
