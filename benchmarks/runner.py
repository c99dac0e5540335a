"""The one benchmark runner (../shared/specs/BENCHMARKS.md): a benchmark is a declaration.

A benchmark module builds a :class:`Benchmark` — its grid of :class:`Cell` (method × setting ×
seed, each one ``edgefl.runtime.simulation.simulate`` call), its bounds, its :class:`Sweep` of
open defaults (on a validation split carved from the training data) and its :class:`Claim` —
and hands it to :func:`main`. The runner does the rest:

- runs the cells in parallel worker processes (up to the core count), each cell on one torch
  thread so the machine is never oversubscribed and a cell gives the same numbers whichever
  worker runs it, alone or beside others;
- caches every finished cell (:mod:`benchmarks.cache`) as ``<benchmark>/cells/<key>-<code
  hash>.json``: the key a hash of the cell's full configuration, the code hash one of the code the
  cell runs (:mod:`benchmarks.provenance`), so an interrupted benchmark resumes, a finished one is
  only re-reported and a code change never reuses a cell; it refuses to run a cell from code that
  differs from its commit unless asked for a draft (``--draft``);
- evaluates the claims in code (paired by seed; mean difference, sd of the differences, sign per
  seed) in one vocabulary: **reproduced** (mean beyond 2 sd, every seed agreeing), **not
  reproduced** (with the measured numbers), **reversed** (significantly the other way), **not
  comparable** (with the reason: too few seeds, not converged — the last-quarter slope of a
  method's mean curve over the seeds at or above 0.5 points per 10 % of rounds —, collapsed runs,
  failed bounds). Non-inferiority rows ("not worse than": mean above −1 sd) are their own kind and
  never count as a paper's claim;
- applies the sanity gates of :mod:`benchmarks.gates` (bounds, collapsed runs) and marks claims over
  cells produced before their setting's declaration in the benchmark's committed
  ``declared.json`` (its main settings; each setting dated by :func:`provenance.declaration`);
- adds to each run's record what the benchmark's ``record_extras`` hook computes from the finished
  run (a metric the toolkit does not report itself, e.g. accuracy on each device's local split),
  and derives runs from runs (``derived``, e.g. :func:`paired_difference`) so a claim can compare
  gains; a claim or sweep whose metric no run has yet reads "metric missing";
- writes ``results.json`` (the shared schema), ``results.md`` (claims first, then tables, then
  figures) and the figures, and regenerates ``benchmarks/README.md``.

``--quick`` runs the benchmark's small profile (a few minutes) into ``runs/bench-quick/<name>``,
never over the committed results. ``--cells A,B --setting S --seeds 101,102,103 --out DIR`` is the
reviewer's check: those methods' cells of one setting with seeds of the reviewer's choosing, run
into DIR (cells, temporary files and ``check.json``), with progress per round and the verdict of
every claim between the chosen methods in that setting.

The runner is split by what its parts are: :mod:`benchmarks.cells` (one cell: its key, its run,
its record), :mod:`benchmarks.cache` (the cache, the parallel run, provenance),
:mod:`benchmarks.claims` (claims, sweeps, verdicts), :mod:`benchmarks.pages`,
:mod:`benchmarks.index` and :mod:`benchmarks.figures` (results.md, the README index, the figures),
:mod:`benchmarks.check` (the reviewer's check); this module holds the declaration
(:class:`Benchmark`), results.json (:func:`build_results`) and the command line, and re-exports
the names the benchmarks import.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks import gates, provenance
from benchmarks.cache import Cache, DirtyCode, code_version, run_cells
from benchmarks.cells import (
    ADDED_OPTIONS,
    BENCHMARKS,
    RECORD_VERSION,
    ROOT,
    Cell,
    RunOutput,
    last_quarter_slope,
    load_hook,
    make_record,
    new_invocation,
    predictions,
    resolved_run,
    run_cell,
)
from benchmarks.check import check, reviewer_cells
from benchmarks.claims import (
    COUNTED,
    KINDS,
    SLOPE_LIMIT,
    VERDICTS,
    Claim,
    MetricMissing,
    Sweep,
    evaluate_claim,
    evaluate_sweep,
    mean_sd,
    metric_scale,
    metric_value,
    paired_difference,
    statistic,
)
from benchmarks.common import machine
from benchmarks.figures import band_panel, plot_results
from benchmarks.index import write_readme_index
from benchmarks.pages import pct, results_markdown, runs_table
from benchmarks.regeneration import machine_of, measured, own_measured, quick_measured, regeneration
from edgefl.config import ADDED_SETTINGS  # settings added after cells were cached
from edgefl.report.recorder import json_safe

__all__ = [
    "ADDED_OPTIONS",
    "ADDED_SETTINGS",
    "BENCHMARKS",
    "COUNTED",
    "KINDS",
    "RECORD_VERSION",
    "ROOT",
    "SLOPE_LIMIT",
    "VERDICTS",
    "Benchmark",
    "Cache",
    "Cell",
    "Claim",
    "DirtyCode",
    "MetricMissing",
    "RunOutput",
    "Sweep",
    "band_panel",
    "build_results",
    "check",
    "code_version",
    "evaluate_claim",
    "evaluate_sweep",
    "last_quarter_slope",
    "load_hook",
    "machine",
    "main",
    "make_record",
    "mean_sd",
    "metric_scale",
    "metric_value",
    "paired_difference",
    "pct",
    "plot_results",
    "predictions",
    "resolved_run",
    "results_markdown",
    "reviewer_cells",
    "run_cell",
    "run_cells",
    "runs_table",
    "statistic",
    "write_readme_index",
]


@dataclass
class Benchmark:
    name: str
    title: str
    description: str  # markdown: setting, widths, budget
    cells: list[Cell]
    claims: list[Claim] = field(default_factory=list)
    sweeps: list[Sweep] = field(default_factory=list)
    #: "centralized": cells of one model on the union of the devices' data, same sample visits;
    #: "local_iid": cells of Local on IID shards.
    bounds: Mapping[str, Sequence[Cell]] = field(default_factory=dict)
    #: extra per-round server metrics to keep (e.g. Velo's cvae_fit)
    keep_server_metrics: Sequence[str] = ()
    #: markdown added to results.md after the tables (diagnostics); gets results.json's content,
    #: returns text
    diagnostics: Callable[[dict], str] | None = None
    #: how to recreate the results (shown on the page)
    command: str = ""
    #: ``"module:function"`` called in the worker after each run with a :class:`RunOutput`; the
    #: dict it returns is merged into the run's record, so a claim or sweep can name its keys as
    #: ``metric`` (named, not passed, so spawned workers can import it)
    record_extras: str | None = None
    #: runs derived from the grid runs at report time (e.g. :func:`paired_difference`), so a claim
    #: can compare differences (a gain in one setting against the gain in another)
    derived: Callable[[list[dict]], list[dict]] | None = None
    #: run once before any cell (not with ``--report-only``): e.g. train a benchmark's oracle
    prepare: Callable[[], None] | None = None
    #: figures beyond the runner's own: gets results.json's content and the results directory,
    #: writes its files there and returns the markdown that shows them (under the page's Figures)
    figures: Callable[[dict, Path], str] | None = None
    #: the paper the claims come from (benchmarks/README.md's line "claims reproduced: k of n")
    paper: str = ""

    def all_cells(self) -> list[Cell]:
        cells = [c for s in self.sweeps for v in s.grid for c in s.cells[v]]
        cells += [c for b in self.bounds.values() for c in b]
        cells += self.cells
        return list(dict.fromkeys(cells))



def build_results(
    bench: Benchmark,
    records: Mapping[Cell, dict],
    machine_before: dict,
    machine_after: dict,
    command: str,
    *,
    bench_dir: Path | None = None,
) -> dict[str, Any]:
    """results.json's content: the runs, the gates, the claims with their verdicts and
    provenance."""
    grid_runs = [records[c] for c in bench.cells]
    derived = bench.derived(grid_runs) if bench.derived is not None else []
    bound_runs = {name: [records[c] for c in cells] for name, cells in bench.bounds.items()}
    bounds = {
        name: mean_sd([r["final_accuracy"] for r in rs])[0] for name, rs in bound_runs.items()
    }
    gate = gates.evaluate(bound_runs, grid_runs)
    claims = [
        evaluate_claim(
            c, grid_runs + derived, collapsed=gate["collapsed"], gate_failures=gate["failures"]
        )
        for c in bench.claims
    ]
    sweep_runs = [records[c] for s in bench.sweeps for v in s.grid for c in s.cells[v]]
    current = provenance.code_hash(bench.record_extras)
    every = list(
        {
            id(r): r for r in grid_runs + [r for rs in bound_runs.values() for r in rs] + sweep_runs
        }.values()
    )
    commits: dict[str, int] = {}
    status: dict[str, int] = {}
    for r in every:
        commits[r.get("code", "unknown")] = commits.get(r.get("code", "unknown"), 0) + 1
        p = provenance.cell_provenance(r, current)
        status[p] = status.get(p, 0) + 1
    decl = provenance.declaration(bench_dir if bench_dir is not None else BENCHMARKS / bench.name)
    code_of = {(r["method"], r["setting"], r["seed"]): r.get("code", "unknown") for r in grid_runs}
    for c in claims:
        cells = []
        for s in c["seeds"]:
            for m in dict.fromkeys((c["a"], c["b"])):
                d = next(
                    (
                        x
                        for x in derived
                        if (x["method"], x["setting"], x["seed"]) == (m, c["setting"], s)
                    ),
                    None,
                )
                cells += (
                    [(x, d["derived_from"][2], s) for x in d["derived_from"][:2]]
                    if d
                    else [(m, c["setting"], s)]
                )
        c["commits"] = sorted({code_of.get(k, "unknown") for k in cells})
        # each cell against its own setting's declaration and the claim's (a derived claim's
        # cells are of other settings)
        cell_commits = {
            (code_of.get(k, "unknown"), setting) for k in cells for setting in (k[1], c["setting"])
        }
        c["counted"] = c["kind"] in COUNTED
        if decl is not None:
            declared = "main" if c["setting"] in decl.get("main", []) else \
                "alternative" if c["setting"] in decl.get("alternatives", []) else "undeclared"
            c["declared"] = declared
            c["counted"] = c["counted"] and declared == "main"
            by_setting = decl.get("declared_at_by_setting") or {}
            c["before_declaration"] = decl.get("declared_at") is None or any(
                (at := by_setting.get(setting, decl.get("declared_at"))) is None
                or provenance.contains(x, at) is not True
                for x, setting in cell_commits
            )
        # the protocol answers a claim only over cells run at a clean commit after its settings were
        # declared
        unclean = [x for x in c["commits"] if x == "unknown" or x.endswith("+dirty")]
        if c["verdict"] in ("reproduced", "not reproduced", "reversed") and (
            unclean or c.get("before_declaration")
        ):
            why = (
                [f"cells from a tree that was not a clean commit ({', '.join(unclean)})"]
                if unclean
                else []
            )
            why += (
                ["cells run before the settings were declared"]
                if c.get("before_declaration")
                else []
            )
            c.update(
                verdict="not comparable",
                holds=False,
                reason=" | ".join([*why, *filter(None, [c.get("reason")])]),
            )
    return {
        "benchmark": bench.name,
        "title": bench.title,
        "paper": bench.paper,
        "code": provenance.code_version(bench.record_extras),
        "code_hash": current,
        "command": command,
        "machine": {"before": machine_before, "after": machine_after},
        "bounds": bounds,
        "bound_runs": bound_runs,
        "gates": gate,
        "provenance": {
            "commits": commits,
            "cells": status,
            "declaration": None
            if decl is None
            else {k: decl.get(k) for k in ("main", "alternatives", "declared_at", "note",
                                           "settings", "declared_at_by_setting")},
        },
        "runs": grid_runs,
        "derived_runs": derived,
        "claims": claims,
        "sweeps": [evaluate_sweep(s, records) for s in bench.sweeps],
        "sweep_runs": sweep_runs,
        # what regenerating the page took and would take (issue 37), from the cells' records
        "regeneration": regeneration(every),
    }


_LINK = re.compile(r"\]\(([^)#\s]+)([^)]*)\)")


def relink(text: str, page_dir: Path, bench_dir: Path) -> str:
    """A page written outside its benchmark's folder (``--out``: a measured regeneration, a
    reviewer's folder) with its relative links that do not resolve there pointed at the files of
    the benchmark's folder they name (``declared.json`` → ``../declared.json``)."""
    page_dir, bench_dir = Path(page_dir).resolve(), Path(bench_dir).resolve()
    if page_dir == bench_dir:
        return text

    def fix(m: re.Match) -> str:
        target, rest = m.group(1), m.group(2)
        if "://" in target or target.startswith("/") or (page_dir / target).exists() \
                or not (bench_dir / target).exists():
            return m.group(0)
        return f"]({os.path.relpath(bench_dir / target, page_dir)}{rest})"

    return _LINK.sub(fix, text)


# -- entry point ----------------------------------------------------------------------------------
def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def main(make: Callable[[bool], Benchmark], argv: Sequence[str] | None = None) -> dict[str, Any]:
    """``python -m benchmarks.<name> [--quick] [--workers N] [--report-only] [--missing-only]
    [--only ROLE] [--settings S,T] [--draft] [--cells A,B --setting S --seeds 1,2] [--out D]``."""
    p = argparse.ArgumentParser(description="Run a benchmark declared for benchmarks/runner.py.")
    p.add_argument(
        "--quick", action="store_true", help="the small profile, into runs/bench-quick/<name>"
    )
    p.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="parallel cells (default: cores)"
    )
    p.add_argument(
        "--report-only", action="store_true", help="rewrite results from cached cells; run nothing"
    )
    p.add_argument("--only", type=_csv, help="run only the cells of these roles, comma-separated "
                   "(sweep, bound, grid; e.g. grid,bound); the rest must be cached to report")
    p.add_argument(
        "--missing-only",
        action="store_true",
        help="run only the cells no code has a cached record of; report every cell from the "
        "cache as --report-only does (cells of other commits are listed so on the page)",
    )
    p.add_argument("--settings", type=_csv, help="run only the cells of these settings (a "
                   "bound's is its own, e.g. centralized); report the rest as --missing-only does")
    p.add_argument(
        "--partial",
        action="store_true",
        help="with cells not cached (a run stopped before its end), report the cells that "
        "finished; the page lists the missing ones",
    )
    p.add_argument("--out", type=Path, help="results directory (default: the benchmark's folder)")
    p.add_argument(
        "--draft",
        action="store_true",
        help="allow cells to run from code that differs from its commit (marked draft, never "
        "reused otherwise)",
    )
    p.add_argument(
        "--cells",
        type=_csv,
        help="the reviewer's check: these methods (comma-separated) of one --setting",
    )
    p.add_argument("--setting", help="the reviewer's check: the setting of --cells")
    p.add_argument(
        "--seeds",
        type=lambda t: [int(x) for x in _csv(t)],
        help="the reviewer's check: seeds, comma-separated",
    )
    args = p.parse_args(argv)
    invocation = new_invocation()  # recorded by every cell this invocation runs
    bench = make(args.quick)
    if args.cells or args.setting or args.seeds:
        if not (args.cells and args.setting and args.seeds):
            p.error("the reviewer's check needs --cells, --setting and --seeds together")
        out = (args.out or ROOT / "runs" / "check" / bench.name).resolve()
        out.mkdir(parents=True, exist_ok=True)
        if out == (BENCHMARKS / bench.name).resolve():
            p.error(
                "the reviewer's check writes into a folder of its own, not the committed results"
            )
        try:
            return check(
                bench,
                args.cells,
                args.setting,
                args.seeds,
                out,
                workers=max(1, args.workers),
                draft=args.draft,
            )
        except DirtyCode as e:
            raise SystemExit(str(e)) from None
    out = (
        args.out
        or (ROOT / "runs" / "bench-quick" / bench.name if args.quick else BENCHMARKS / bench.name)
    ).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cache = Cache(out / "cells", bench.record_extras, draft=args.draft)
    command = bench.command or f"python -m benchmarks.{bench.name}" + (
        " --quick" if args.quick else ""
    )
    before = dict(machine(), invocation=invocation)  # whose loads they are (regeneration)
    cells = bench.all_cells()
    if args.only:
        if unknown := sorted(set(args.only) - {"sweep", "bound", "grid"}):
            p.error(f"--only takes sweep, bound and grid, not {', '.join(unknown)}")
        cells = [c for c in cells if c.role in args.only]
    every = bench.all_cells()
    if args.settings:  # one setting regenerated after its declaration (or the code) changed
        if unknown := sorted(set(args.settings) - {c.setting for c in every}):
            p.error(f"no cells of setting(s) {', '.join(unknown)}; this benchmark's settings: "
                    + ", ".join(dict.fromkeys(c.setting for c in every)))
        cells = [c for c in cells if c.setting in args.settings]
    if args.missing_only:  # e.g. cells added to a grid after the rest ran: only they run
        cells = [c for c in cells if cache.find(c) is None]
    if args.report_only:
        records = {c: cache.find(c) for c in every}
    else:
        if bench.prepare is not None and any(cache.get(c) is None for c in cells):
            bench.prepare()
        try:
            run_cells(
                cells,
                cache,
                workers=max(1, args.workers),
                keep_server_metrics=bench.keep_server_metrics,
                tmp_root=out / "tmp",
                invocation=invocation,
            )
        except DirtyCode as e:
            raise SystemExit(str(e)) from None
        find = args.missing_only or args.settings  # the other cells from any code
        records = {c: (cache.find if find else cache.get)(c) for c in every}
    missing = [c for c, r in records.items() if r is None]
    if missing and not args.partial:
        print(
            f"{len(missing)} cells are not cached yet (e.g. {missing[0].label}); results not "
            "written (--partial reports the rest)"
        )
        return {}
    if missing:  # the cells that finished; a sweep with a cell missing is left out
        bench = replace(
            bench,
            cells=[c for c in bench.cells if records[c] is not None],
            bounds={k: [c for c in v if records[c] is not None] for k, v in bench.bounds.items()},
            sweeps=[s for s in bench.sweeps if all(records[c] is not None
                                                   for v in s.grid for c in s.cells[v])],
        )
    results = build_results(
        bench, records, before, machine(), command, bench_dir=BENCHMARKS / bench.name
    )
    results["missing"] = [c.label for c in missing]
    if args.report_only and (out / "results.json").exists():
        # a report rewritten from cached cells: the machine is that of the run that made them
        previous = json.loads((out / "results.json").read_text()).get("machine")
        results["machine"] = machine_of(previous, results["regeneration"], results["machine"])
    if args.out is None and not args.quick:  # the page itself: a measured regeneration beside it
        results["regeneration"]["measured"] = measured(
            BENCHMARKS / bench.name, results["claims"], results["runs"],
            results["regeneration"]["cells"]) or own_measured(results)
        results["regeneration"]["quick"] = quick_measured(BENCHMARKS / bench.name,
                                                          results["claims"])
    (out / "results.json").write_text(json.dumps(json_safe(results), indent=1) + "\n")
    plot_results(results, out)
    figures = bench.figures(results, out) if bench.figures is not None else ""
    (out / "results.md").write_text(
        relink(results_markdown(bench, results, figures), out, BENCHMARKS / bench.name))
    if not args.quick and args.out is None:
        write_readme_index()
    from benchmarks.pages import counts

    k, n = counts(results["claims"])
    for c in results["claims"]:
        print(f"{c['verdict']:>15}: {c['statement']} [{c['setting']}] ({KINDS[c['kind']]})")
    for f in results["gates"]["failures"]:
        print(f"SANITY GATE FAILS: {f}")
    if results["gates"]["collapsed"]:
        print(f"COLLAPSED RUNS: {len(results['gates']['collapsed'])} (listed in results.md)")
    print(f"claims reproduced: {k} of {n}")
    print(f"results: {out / 'results.md'}")
    return results
