"""The one benchmark runner (../shared/specs/BENCHMARKS.md): a benchmark is a declaration.

A benchmark module builds a :class:`Benchmark` — its grid of :class:`Cell` (method × setting ×
seed, each one ``edgefl.runtime.simulation.simulate`` call), its bounds, its :class:`Sweep` of
open defaults (on a validation split carved from the training data) and its :class:`Claim` —
and hands it to :func:`main`. The runner does the rest:

- runs the cells in parallel worker processes (up to the core count), each cell on one torch
  thread so the machine is never oversubscribed and a cell gives the same numbers whichever
  worker runs it, alone or beside others;
- caches every finished cell as ``<benchmark>/cells/<key>.json``, the key a hash of the cell's
  full configuration, so an interrupted benchmark resumes and a finished one is only re-reported;
- evaluates the claims in code (paired by seed; mean difference, sd of the differences, sign per
  seed; a strict claim holds when the mean exceeds 2 sd and every seed agrees, a weak one when the
  mean is above −1 sd) and reads a claim only where every compared method has converged (the
  last-quarter slope of its mean curve over the seeds below 0.5 points per 10 % of rounds);
- adds to each run's record what the benchmark's ``record_extras`` hook computes from the finished
  run (a metric the toolkit does not report itself, e.g. accuracy on each device's local split),
  and derives runs from runs (``derived``, e.g. :func:`paired_difference`) so a claim can compare
  gains; a claim or sweep whose metric no run has yet reads "metric missing";
- writes ``results.json`` (the shared schema), ``results.md`` (claims first, then tables, then
  figures) and the figures, and regenerates ``benchmarks/README.md``.

``--quick`` runs the benchmark's small profile (a few minutes) into ``runs/bench-quick/<name>``,
never over the committed results.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import machine

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = Path(__file__).resolve().parent
#: Converged: the per-round accuracy moved less than this many points per 10 % of rounds over the
#: last quarter of the run (BENCHMARKS.md).
SLOPE_LIMIT = 0.5
#: Bumped when a cell's record format changes (part of every cache key).
RECORD_VERSION = 1


# -- declarations ---------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Cell:
    """One run: ``config`` is the explicit RunConfig settings (the algorithm's defaults fill the rest)."""

    method: str
    setting: str
    seed: int
    config: Mapping[str, Any]
    role: str = "grid"  # grid | bound | sweep

    def full_config(self) -> dict[str, Any]:
        return {**self.config, "seed": self.seed}

    @property
    def key(self) -> str:
        """Hash of the *resolved* run: the explicit settings, the algorithm's defaults and its
        options with their defaults, so a changed default never reuses a stale result."""
        blob = json.dumps({"v": RECORD_VERSION, "run": resolved_run(self)}, sort_keys=True, default=list)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def _identity(self) -> tuple:
        return (self.role, self.method, self.setting, self.seed, json.dumps(self.config, sort_keys=True, default=list))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Cell) and self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    @property
    def label(self) -> str:
        return f"{self.role}:{self.setting}:{self.method}:s{self.seed}"


@dataclass(frozen=True)
class Claim:
    """``statement`` is ``"a OP b"`` with OP one of > ≥ < ≤ (>= <= accepted); paired by seed."""

    id: str
    statement: str
    setting: str
    metric: str = "final_accuracy"
    metric_a: str | None = None
    metric_b: str | None = None
    note: str = ""
    #: not one of the paper's claims but a measured explanation of one (another setting, a control):
    #: evaluated the same way, shown in a table of its own and left out of the claims' count
    diagnostic: bool = False

    def parse(self) -> tuple[str, str, str]:
        for op in ("≥", "≤", ">=", "<=", ">", "<"):
            a, sep, b = self.statement.partition(f" {op} ")
            if sep:
                return a.strip(), {">=": "≥", "<=": "≤"}.get(op, op), b.strip()
        raise ValueError(f"claim {self.id}: cannot parse {self.statement!r} (use 'a > b', 'a ≥ b', …)")


@dataclass(frozen=True)
class Sweep:
    """A default the paper leaves open, chosen on the validation split by mean ``metric``.

    With ``default`` (the method's current value, in ``grid``) the sweep keeps it unless the best
    value beats it by more than the noise (the larger sd over seeds of the two): a difference
    inside the noise does not move a default."""

    parameter: str
    grid: Sequence[Any]
    cells: Mapping[Any, Sequence[Cell]]  # grid value → its cells (seeds, settings)
    metric: str = "final_accuracy"
    note: str = ""
    default: Any = None

    def __post_init__(self):
        if self.default is not None and self.default not in self.grid:
            raise ValueError(f"sweep {self.parameter}: the default {self.default!r} is not in the grid {list(self.grid)}")


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
    #: markdown added to results.md after the tables (diagnostics); gets results.json's content, returns text
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
    #: figures beyond the runner's own: gets results.json's content and the results directory, writes its
    #: files there and returns the markdown that shows them (under the page's Figures)
    figures: Callable[[dict, Path], str] | None = None

    def all_cells(self) -> list[Cell]:
        cells = [c for s in self.sweeps for v in s.grid for c in s.cells[v]]
        cells += [c for b in self.bounds.values() for c in b]
        cells += self.cells
        return list(dict.fromkeys(cells))


# -- running a cell -------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunOutput:
    """What a finished cell leaves for a benchmark's ``record_extras`` hook; ``run_dir`` (config.json,
    rounds.jsonl, models/) exists only while the hook runs."""

    cell: Cell
    config: Any  # the resolved edgefl.config.RunConfig
    run_dir: Path
    summary: dict[str, Any]
    rounds: list[dict[str, Any]]
    server: Any = None  # the run's server half after the last round (e.g. FedVTC's ψ, for sample grids)


def load_hook(spec: str) -> Callable[[RunOutput], Mapping[str, Any]]:
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"record_extras {spec!r}: name it 'module:function'")
    return getattr(importlib.import_module(module), name)


_RESOLVED: dict[str, dict[str, Any]] = {}

#: Options added to a method after cells were cached, each with the value that reproduces the
#: computation from before it existed. A cell whose resolved option has that value is keyed
#: without it, so adding an option that is off by default does not re-key (and re-run) every cached
#: cell of the method; a cell that sets another value, or a later default that differs, is keyed
#: with it. A fact about the method's history: entries are never removed.
ADDED_OPTIONS: dict[str, dict[str, Any]] = {
    "fedvtc": {"align_weight": None, "proto_rc_weight": 0.0, "psi_bn": "average"},
    # the defences (issue 19), off by default
    **{m: {"aggregator": "mean", "trim": 0.2, "clip_norm": 0.0} for m in ("fedhe", "felo", "velo")},
}
# devices re-estimating the BatchNorm statistics they receive: off by default for Felo/Velo (the
# paper's FedAvg); HeteroFL/HierarchyFL's default since issue 15's quick command, not before
for _method in ("felo", "velo", "heterofl", "hierarchyfl"):
    ADDED_OPTIONS.setdefault(_method, {})["bn_stats"] = "average"
for _method in ("felo", "velo"):  # the classifier trained on the server's class features: off by default
    ADDED_OPTIONS[_method]["server_feature_ce"] = 0.0


#: Run settings added to RunConfig after cells were cached, each with the value that reproduces the
#: computation from before it existed: keyed only when a cell resolves to another value (as
#: ADDED_OPTIONS). Entries are never removed.
ADDED_SETTINGS: dict[str, Any] = {
    # the server optimizer (issue 39): plain averaging
    "server_opt": "fedavg", "server_opt_lr": None, "server_opt_betas": [0.9, 0.99], "server_opt_eps": 1e-3,
}


def resolved_run(cell: Cell) -> dict[str, Any]:
    """The run configuration ``simulate`` will use (output and thread settings aside), with the
    method's options resolved."""
    blob = json.dumps(cell.full_config(), sort_keys=True, default=list)
    if blob not in _RESOLVED:
        from edgefl.algorithms import get_algorithm
        from edgefl.config import resolve_config

        algorithm = get_algorithm(cell.config.get("algorithm", "fedavg"))
        cfg = resolve_config(cell.full_config(), dict(algorithm.defaults))
        options = algorithm.parse_options(cfg.options)
        run = cfg.model_dump(mode="json", exclude={"out_dir", "run_name", "threads", "options"})
        run = {k: v for k, v in run.items() if not (k in ADDED_SETTINGS and v == ADDED_SETTINGS[k])}
        added = ADDED_OPTIONS.get(cfg.algorithm, {})
        run["options"] = {k: v for k, v in dataclasses.asdict(options).items() if not (k in added and v == added[k])}
        _RESOLVED[blob] = run
    return _RESOLVED[blob]


def _worker_init() -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import threading

    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT))
    parent = os.getppid()

    def orphaned() -> None:  # a killed benchmark must not leave its cells running
        while os.getppid() == parent:
            time.sleep(2)
        os._exit(1)

    threading.Thread(target=orphaned, daemon=True).start()


def run_cell(cell: Cell, keep_server_metrics: Sequence[str] = (), record_extras: str | None = None) -> dict[str, Any]:
    """Run one cell in this process and return its record (what results.json keeps per run)."""
    import torch

    from edgefl.algorithms import get_algorithm
    from edgefl.config import resolve_config
    from edgefl.report.recorder import read_rounds
    from edgefl.runtime.simulation import simulate

    torch.set_num_threads(1)
    cfg_dict = cell.full_config()
    with tempfile.TemporaryDirectory(prefix="edgefl-bench-") as tmp:
        explicit = {**cfg_dict, "out_dir": tmp, "run_name": "run", "threads": 1}
        cfg = resolve_config(explicit, dict(get_algorithm(explicit.get("algorithm", "fedavg")).defaults))
        t0 = time.perf_counter()
        server: list[Any] = []
        summary = simulate(cfg, plots=False, on_done=server.append)
        wall = time.perf_counter() - t0
        rounds = read_rounds(Path(tmp) / "run")
        record = make_record(cell, resolved_run(cell), summary, rounds, wall, keep_server_metrics)
        if record_extras:
            extras = dict(load_hook(record_extras)(RunOutput(cell, cfg, Path(tmp) / "run", summary, rounds, server[0] if server else None)))
            clash = sorted(set(extras) & set(record))
            if clash:
                raise ValueError(f"record_extras {record_extras} returned keys the record already has: {clash}")
            record.update(extras, extras_from=record_extras)
    return record


def make_record(cell: Cell, resolved: dict, summary: dict, rounds: list[dict], wall: float,
                keep_server_metrics: Sequence[str] = ()) -> dict[str, Any]:
    train_rounds = [r for r in rounds if r.get("phase", "train") == "train"]
    completed = sum(len(r["completed"]) for r in train_rounds) or 1
    per_round = []
    for r in rounds:
        entry: dict[str, Any] = {"round": r["round"] + 1}
        if "eval" in r:
            entry["accuracy"] = r["eval"]["mean_accuracy"]
            entry["per_tier"] = r["eval"]["tier_accuracy"]
        server = {k: v for k, v in (r.get("server") or {}).items() if k in keep_server_metrics}
        if server:
            entry["server"] = server
        per_round.append(entry)
    total_rounds = len(train_rounds)
    final = summary["mean_accuracy"]
    if total_rounds and per_round and per_round[-1]["round"] == total_rounds and "accuracy" not in per_round[-1]:
        per_round[-1]["accuracy"] = final  # the final evaluation closes the curve
        per_round[-1]["per_tier"] = summary["tier_accuracy"]
    return {
        "method": cell.method,
        "setting": cell.setting,
        "seed": cell.seed,
        "role": cell.role,
        "key": cell.key,
        "final_accuracy": final,
        "per_tier": summary["tier_accuracy"],
        "client_accuracy": summary["client_accuracy"],
        "per_round": per_round,
        "slope": last_quarter_slope(per_round, total_rounds),
        "bytes_up_per_device_round": sum(r["bytes_up_total"] for r in train_rounds) / completed,
        "bytes_down_per_device_round": sum(r["bytes_down_total"] for r in train_rounds) / completed,
        "wall_seconds": wall,
        "config": cell.full_config(),
        "resolved_config": resolved,
        "code": code_version(),
    }


def last_quarter_slope(per_round: list[dict], total_rounds: int) -> float | None:
    """Least-squares slope of accuracy over the last quarter of rounds, in points per 10 % of
    rounds (None with fewer than two evaluations there)."""
    if not total_rounds:
        return None
    start = total_rounds * 0.75
    pts = [(p["round"], p["accuracy"]) for p in per_round if "accuracy" in p and p["round"] >= start and p["accuracy"] is not None]
    if len(pts) < 2:
        return None
    xs, ys = [p[0] for p in pts], [100 * p[1] for p in pts]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return slope * 0.1 * total_rounds


_CODE: str | None = None


def code_version() -> str:
    global _CODE
    if _CODE is None:
        try:
            head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
            dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "edgefl", "benchmarks"], capture_output=True, text=True).stdout.strip()
            _CODE = head + ("+dirty" if dirty else "")
        except (OSError, subprocess.CalledProcessError):
            _CODE = "unknown"
    return _CODE


class Cache:
    """Finished cells as JSON files named by their key. With ``record_extras`` a record made
    without that hook is a miss (it lacks the metrics the claims name)."""

    def __init__(self, directory: Path, record_extras: str | None = None):
        self.dir = Path(directory)
        self.record_extras = record_extras

    def path(self, cell: Cell) -> Path:
        return self.dir / f"{cell.key}.json"

    def get(self, cell: Cell) -> dict | None:
        p = self.path(cell)
        if not p.exists():
            return None
        record = json.loads(p.read_text())
        if record.get("extras_from") != self.record_extras:
            return None
        # the same configuration run for another label (a sweep value that is also a grid cell)
        return {**record, "method": cell.method, "setting": cell.setting, "role": cell.role}

    def put(self, cell: Cell, record: dict) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.path(cell).with_suffix(".tmp")
        tmp.write_text(json.dumps(_clean(record), indent=1) + "\n")
        tmp.replace(self.path(cell))  # atomic: an interrupted write never leaves half a record


def run_cells(cells: Sequence[Cell], cache: Cache, *, workers: int, keep_server_metrics: Sequence[str] = (),
              log: Callable[[str], None] = lambda m: print(m, flush=True)) -> list[dict]:
    """Every cell's record, running the ones not in the cache (``workers`` processes at a time)."""
    records: dict[Cell, dict] = {}
    todo, waiting = [], {}  # one run per key: cells that spell one configuration differently share it
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
    if todo:
        t0 = time.perf_counter()
        import multiprocessing as mp

        with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"), initializer=_worker_init) as pool:
            pending = {pool.submit(run_cell, c, tuple(keep_server_metrics), cache.record_extras): c for c in todo}
            done_count = 0
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    cell = pending.pop(fut)
                    record = fut.result()  # a failing cell stops the benchmark: it is a bug
                    cache.put(cell, record)
                    for same in waiting[cell.key]:
                        records[same] = cache.get(same)
                    done_count += 1
                    log(f"[{done_count}/{len(todo)}] {cell.label}: {100 * record['final_accuracy']:.2f}% "
                        f"in {record['wall_seconds']:.0f}s ({time.perf_counter() - t0:.0f}s elapsed)")
    return [records[c] for c in cells]


# -- claims ---------------------------------------------------------------------------------------
class MetricMissing(KeyError):
    """A run has no value for the metric a claim or sweep names (not produced yet)."""


def metric_value(record: Mapping[str, Any], path: str) -> float:
    """``record``'s metric at a dotted ``path`` (``per_tier.1``), or the difference ``"a - b"`` of two."""
    if " - " in path:
        a, b = path.split(" - ", 1)
        return metric_value(record, a) - metric_value(record, b)
    value: Any = record
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            value = None
            break
        value = value[part]
    if value is None:
        raise MetricMissing(f"run {record.get('method')}/{record.get('setting')}/s{record.get('seed')} has no metric {path!r}")
    return float(value)


def paired_difference(runs: Iterable[Mapping[str, Any]], a: str, b: str, setting: str, *, method: str,
                      as_setting: str | None = None) -> list[dict[str, Any]]:
    """Derived runs ``a − b`` in ``setting``, paired by seed: every numeric top-level metric and
    every tier of ``per_tier`` differenced, labelled ``method`` in ``as_setting``; their slope is the
    larger of the pair's, so a claim on a difference is read only where both runs converged."""
    by = {(r["method"], r["seed"]): r for r in runs if r["setting"] == setting and r.get("role", "grid") == "grid"}
    out = []
    for seed in sorted({s for (m, s) in by if m == a} & {s for (m, s) in by if m == b}):
        ra, rb = by[(a, seed)], by[(b, seed)]
        record: dict[str, Any] = {"method": method, "setting": as_setting or setting, "seed": seed, "role": "grid",
                                  "derived_from": [a, b, setting]}
        for k, v in ra.items():
            if k in ("seed", "wall_seconds", "slope") or isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            if isinstance(rb.get(k), (int, float)) and not isinstance(rb.get(k), bool):
                record[k] = v - rb[k]
        tiers = set(ra.get("per_tier") or {}) & set(rb.get("per_tier") or {})
        record["per_tier"] = {t: ra["per_tier"][t] - rb["per_tier"][t] for t in sorted(tiers)
                              if ra["per_tier"][t] is not None and rb["per_tier"][t] is not None}
        slopes = [ra.get("slope"), rb.get("slope")]
        record["slope"] = None if None in slopes else max(slopes, key=abs)
        out.append(record)
    return out


def evaluate_claim(claim: Claim, runs: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    a, op, b = claim.parse()
    metric_a, metric_b = claim.metric_a or claim.metric, claim.metric_b or claim.metric
    by = {(r["method"], r["setting"], r["seed"]): r for r in runs if r.get("role", "grid") == "grid"}
    seeds = sorted({s for (m, st, s) in by if m == a and st == claim.setting} & {s for (m, st, s) in by if m == b and st == claim.setting})
    out = {
        "id": claim.id, "statement": claim.statement, "a": a, "b": b, "op": op, "setting": claim.setting,
        "metric": claim.metric, "metric_a": metric_a, "metric_b": metric_b, "seeds": seeds, "note": claim.note,
        **({"diagnostic": True} if claim.diagnostic else {}),
    }
    if not seeds:
        return {**out, "mean_diff": None, "sd": None, "signs": [], "converged": False, "holds": False, "verdict": "no runs"}
    try:
        diffs = [metric_value(by[(a, claim.setting, s)], metric_a) - metric_value(by[(b, claim.setting, s)], metric_b) for s in seeds]
    except MetricMissing as e:
        return {**out, "mean_diff": None, "sd": None, "signs": [], "converged": False, "holds": False,
                "verdict": "metric missing", "missing": str(e.args[0])}
    mean = statistics.fmean(diffs)
    sd = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
    signs = [int(math.copysign(1, d)) if d != 0 else 0 for d in diffs]
    if op == ">":
        stat = mean > 2 * sd and all(d > 0 for d in diffs)
    elif op == "<":
        stat = mean < -2 * sd and all(d < 0 for d in diffs)
    elif op == "≥":
        stat = mean > -sd if sd > 0 else mean >= 0
    else:  # ≤
        stat = mean < sd if sd > 0 else mean <= 0
    per_method = {m: [by[(m, claim.setting, s)].get("slope") for s in seeds] for m in dict.fromkeys((a, b))}
    slopes = [x for xs in per_method.values() for x in xs]
    # A method's slope is that of its mean curve over the seeds (the mean of the runs' slopes): the
    # protocol reads a claim where every compared *method* has flattened. One run's least-squares
    # slope over a noisy last quarter (half participation swings a curve by 1–2 points per
    # evaluation) has a standard error near the limit itself, so the largest of ten such slopes
    # crosses it by chance in runs that have converged; the mean over seeds averages that noise out.
    method_slopes = [None if None in xs else statistics.fmean(xs) for xs in per_method.values()]
    converged = all(x is not None and abs(x) < SLOPE_LIMIT for x in method_slopes)
    enough = len(seeds) >= 3
    holds = stat and converged and enough
    verdict = "holds" if holds else "does not hold" if converged and enough else \
        ("not converged" if enough else "too few seeds")
    return {**out, "mean_diff": mean, "sd": sd, "diffs": diffs, "signs": signs, "statistic_holds": stat,
            "converged": converged, "method_slope": max((abs(x) for x in method_slopes if x is not None), default=None),
            "max_abs_slope": max((abs(x) for x in slopes if x is not None), default=None),
            "holds": holds, "verdict": verdict}


def evaluate_sweep(sweep: Sweep, records: Mapping[Cell, Mapping[str, Any]]) -> dict[str, Any]:
    means, sds = [], []
    missing = None
    for value in sweep.grid:
        try:
            vals = [metric_value(records[c], sweep.metric) for c in sweep.cells[value]]
        except MetricMissing as e:
            missing = str(e.args[0])
            means.append(None)
            sds.append(None)
            continue
        means.append(statistics.fmean(vals))
        sds.append(statistics.stdev(vals) if len(vals) > 1 else 0.0)
    best = None if missing else sweep.grid[max(range(len(means)), key=lambda i: means[i])]
    chosen, kept = best, False
    if best is not None and sweep.default is not None and sweep.default in sweep.grid and best != sweep.default:
        b, d = sweep.grid.index(best), sweep.grid.index(sweep.default)
        if means[b] - means[d] <= max(sds[b], sds[d]):
            chosen, kept = sweep.default, True
    return {"parameter": sweep.parameter, "grid": list(sweep.grid), "validation_accuracy": means,
            "validation_sd": sds, "metric": sweep.metric, "chosen": chosen, "best": best,
            "default": sweep.default, "kept_default": kept, "note": sweep.note,
            "seeds": sorted({c.seed for v in sweep.grid for c in sweep.cells[v]}),
            **({"missing": missing} if missing else {})}


# -- results --------------------------------------------------------------------------------------
def _clean(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def mean_sd(xs: Sequence[float]) -> tuple[float, float]:
    xs = [x for x in xs if x is not None]
    if not xs:
        return float("nan"), float("nan")
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def build_results(bench: Benchmark, records: Mapping[Cell, dict], machine_before: dict, machine_after: dict,
                  command: str) -> dict[str, Any]:
    grid_runs = [records[c] for c in bench.cells]
    derived = bench.derived(grid_runs) if bench.derived is not None else []
    bounds = {}
    for name, cells in bench.bounds.items():
        bounds[name] = mean_sd([records[c]["final_accuracy"] for c in cells])[0]
    return {
        "benchmark": bench.name,
        "title": bench.title,
        "code": code_version(),
        "command": command,
        "machine": {"before": machine_before, "after": machine_after},
        "bounds": bounds,
        "bound_runs": {name: [records[c] for c in cells] for name, cells in bench.bounds.items()},
        "runs": grid_runs,
        "derived_runs": derived,
        "claims": [evaluate_claim(c, grid_runs + derived) for c in bench.claims],
        "sweeps": [evaluate_sweep(s, records) for s in bench.sweeps],
        "sweep_runs": [records[c] for s in bench.sweeps for v in s.grid for c in s.cells[v]],
    }


def pct(x: float | None, sd: float | None = None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{100 * x:.2f}" + (f" ± {100 * sd:.2f}" if sd is not None and not math.isnan(sd) else "")


def metric_scale(metric: str) -> int:
    """Accuracies (fractions) are shown in points; other metrics (bytes, seconds) as they are."""
    return 100 if "accuracy" in metric or metric.startswith("per_tier") or "agreement" in metric else 1


def claims_table(claims: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = ["| claim | setting | metric | mean diff (points for accuracies) | sd | signs per seed | method slope | largest run slope | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in claims:
        scale = metric_scale(c["metric_a"])
        md = "—" if c["mean_diff"] is None else f"{scale * c['mean_diff']:+.2f}"
        sd = "—" if c["sd"] is None else f"{scale * c['sd']:.2f}"
        signs = " ".join("+" if s > 0 else "−" if s < 0 else "0" for s in c["signs"])
        slope = "—" if c.get("method_slope") is None else f"{c['method_slope']:.2f}"
        run_slope = "—" if c.get("max_abs_slope") is None else f"{c['max_abs_slope']:.2f}"
        verdict = {"holds": "**holds**", "does not hold": "**does not hold**"}.get(c["verdict"], c["verdict"])
        metric = c["metric"] if c["metric_a"] == c["metric_b"] else f"{c['metric_a']} vs {c['metric_b']}"
        lines.append(f"| `{c['statement']}` | {c['setting']} | {metric} | {md} | {sd} | {signs} | {slope} | {run_slope} | {verdict} |")
    return lines


def runs_table(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    settings = list(dict.fromkeys(r["setting"] for r in runs))
    lines = []
    for setting in settings:
        rs = [r for r in runs if r["setting"] == setting]
        tiers = list(dict.fromkeys(t for r in rs for t in r["per_tier"]))
        lines += [f"### {setting}", "",
                  "| method | seeds | final acc % | " + " | ".join(f"tier {t}" for t in tiers) + " | slope | up B/dev-round | down B/dev-round | wall s |",
                  "|---|---|---|" + "---|" * len(tiers) + "---|---|---|---|"]
        for method in dict.fromkeys(r["method"] for r in rs):
            mr = [r for r in rs if r["method"] == method]
            acc = mean_sd([r["final_accuracy"] for r in mr])
            tier_cells = [pct(*mean_sd([r["per_tier"].get(t) for r in mr])) for t in tiers]
            slope = mean_sd([r["slope"] for r in mr])[0]
            lines.append(
                f"| {method} | {len(mr)} | {pct(*acc)} | " + " | ".join(tier_cells)
                + f" | {slope:.2f} | {statistics.fmean(r['bytes_up_per_device_round'] for r in mr):,.0f}"
                + f" | {statistics.fmean(r['bytes_down_per_device_round'] for r in mr):,.0f}"
                + f" | {statistics.fmean(r['wall_seconds'] for r in mr):.0f} |"
            )
        lines.append("")
    return lines


def band_panel(ax, runs: Sequence[Mapping[str, Any]], value: Callable[[Mapping[str, Any]], float | None],
               bounds: Mapping[str, float | None], title: str, ylabel: str, *, lw: float = 1.4, fontsize: int = 10,
               legend_size: int = 7) -> None:
    """One panel of curves per round: each method's mean over its runs (``value`` of a per-round
    entry, a fraction) with a band of ± 1 sd, and each bound as a dashed line; in %, 0 to 100."""
    import numpy as np

    for method in dict.fromkeys(r["method"] for r in runs):
        mr = [r for r in runs if r["method"] == method]
        xs = sorted({p["round"] for r in mr for p in r["per_round"] if value(p) is not None})
        curves = [[next((value(p) for p in r["per_round"] if p["round"] == x and value(p) is not None), np.nan)
                   for x in xs] for r in mr]
        arr = 100 * np.array(curves, dtype=float)
        m, s = np.nanmean(arr, 0), np.nanstd(arr, 0)
        (line,) = ax.plot(xs, m, label=f"{method} (n={len(mr)})", lw=lw)
        ax.fill_between(xs, m - s, m + s, color=line.get_color(), alpha=0.18)
    for name, bound in bounds.items():
        if bound is not None and not (isinstance(bound, float) and math.isnan(bound)):
            ax.axhline(100 * bound, ls="--", lw=0.9, color="grey")
            ax.text(ax.get_xlim()[0], 100 * bound, f" {name}", fontsize=7, va="bottom", color="grey")
    ax.set_title(title, fontsize=fontsize)
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size, loc="lower right")


def plot_results(results: Mapping[str, Any], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["runs"]
    settings = list(dict.fromkeys(r["setting"] for r in runs))
    paths = []
    n = len(settings)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.8 * rows), squeeze=False)
    for ax, setting in zip(axes.flat, settings, strict=False):
        rs = [r for r in runs if r["setting"] == setting]
        band_panel(ax, rs, lambda p: p.get("accuracy"), results.get("bounds", {}),
                   f"{results['benchmark']}: {setting}", "mean device test accuracy (%)")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle("accuracy per round (mean ± sd over seeds)", fontsize=11)
    fig.tight_layout()
    paths.append(out_dir / "accuracy.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.8 * rows), squeeze=False)
    for ax, setting in zip(axes.flat, settings, strict=False):
        rs = [r for r in runs if r["setting"] == setting]
        for method in dict.fromkeys(r["method"] for r in rs):
            mr = [r for r in rs if r["method"] == method]
            b = statistics.fmean(r["bytes_up_per_device_round"] + r["bytes_down_per_device_round"] for r in mr)
            a, s = mean_sd([r["final_accuracy"] for r in mr])
            ax.errorbar([max(b, 1)], [100 * a], yerr=[100 * s], fmt="o", capsize=3, label=method)
        ax.set_xscale("log")
        ax.set_title(f"{results['benchmark']}: {setting}", fontsize=10)
        ax.set_xlabel("bytes per device-round, up + down (log)")
        ax.set_ylabel("final accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle("accuracy vs traffic", fontsize=11)
    fig.tight_layout()
    paths.append(out_dir / "accuracy_bytes.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def results_markdown(bench: Benchmark, results: Mapping[str, Any], figures: str = "") -> str:
    claims = [c for c in results["claims"] if not c.get("diagnostic")]
    diagnostic = [c for c in results["claims"] if c.get("diagnostic")]
    held = sum(c["holds"] for c in claims)
    m0, m1 = results["machine"]["before"], results["machine"]["after"]
    lines = [f"# {bench.title}", "",
             f"Claims: **{held} of {len(claims)} hold** (evaluated by `benchmarks/runner.py` from the runs in "
             "`results.json`; a strict claim holds when the mean paired difference exceeds 2 sd and every seed agrees, "
             f"a weak one when it is above −1 sd; a claim is read only where every compared method's last-quarter slope "
             f"(its mean curve over the seeds) is below {SLOPE_LIMIT} points per 10 % of rounds, with ≥ 3 seeds; the "
             "largest single run's slope is shown beside it).", ""]
    lines += claims_table(claims) + [""]
    if diagnostic:
        lines += [f"Diagnostic claims (not the paper's: other settings and controls that explain the claims above, "
                  f"evaluated the same way; {sum(c['holds'] for c in diagnostic)} of {len(diagnostic)} hold):", ""]
        lines += claims_table(diagnostic) + [""]
    missing = [c for c in results["claims"] if c["verdict"] == "metric missing"]
    if missing:
        lines += ["Metric missing (the toolkit does not produce it yet): "
                  + "; ".join(f"`{c['statement']}` [{c['setting']}]: {c.get('missing', '')}" for c in missing), ""]
    lines += ["## Setting", "", bench.description.strip(), "",
              f"Command: `{results['command']}`  ", f"Code: `{results['code']}`  ",
              f"Machine: {m0.get('cores')} cores, load (1/5/15 min) {m0.get('loadavg_1_5_15')} at the start ({m0.get('date')}), "
              f"{m1.get('loadavg_1_5_15')} at the end ({m1.get('date')}). Cells run one torch thread each, "
              "one cell per core; wall times are per cell and rough on a shared machine.", ""]
    if results["bounds"]:
        lines += ["## Bounds", ""]
        for name in bench.bounds:
            rs = results["bound_runs"][name]
            a, s = mean_sd([r["final_accuracy"] for r in rs])
            desc = ", ".join(sorted({f"{r['method']} in {r['setting']}" for r in rs}))
            lines.append(f"- **{name}**: {pct(a, s)} % ({desc}; {len(rs)} run(s))")
        lines.append("")
    lines += ["## Runs (test set; mean ± sd over seeds)", ""] + runs_table(results["runs"])
    if results.get("derived_runs"):
        lines += ["## Paired differences (derived from the runs above, paired by seed)", "",
                  "| difference | setting | from | seeds | final acc (points) | per tier (points) |", "|---|---|---|---|---|---|"]
        derived = results["derived_runs"]
        for key in dict.fromkeys((r["method"], r["setting"]) for r in derived):
            rs = [r for r in derived if (r["method"], r["setting"]) == key]
            a, b, setting = rs[0]["derived_from"]
            tiers = list(dict.fromkeys(t for r in rs for t in r["per_tier"]))
            per_tier = ", ".join(f"{t}: {pct(*mean_sd([r['per_tier'].get(t) for r in rs]))}" for t in tiers)
            lines.append(f"| {key[0]} | {key[1]} | {a} − {b} in {setting} | {len(rs)} | "
                         f"{pct(*mean_sd([r.get('final_accuracy') for r in rs]))} | {per_tier} |")
        lines.append("")
    if results["sweeps"]:
        lines += ["## Sweeps (validation split carved from the training data; the test set is never used)", ""]
        for s in results["sweeps"]:
            vals = ", ".join(f"{v}: {pct(a, sd)}" for v, a, sd in zip(s["grid"], s["validation_accuracy"], s["validation_sd"], strict=True))
            chosen = f"chosen **{s['chosen']}**" if s["chosen"] is not None else f"metric missing ({s.get('missing', '')})"
            if s.get("kept_default"):
                chosen += f" (the default: the best, {s['best']}, is within the noise of it)"
            lines.append(f"- **{s['parameter']}** by `{s['metric']}` (seeds {s['seeds']}): {vals} → {chosen}. {s['note']}")
        lines.append("")
    if bench.diagnostics is not None:
        lines += [bench.diagnostics(results).strip(), ""]
    lines += ["## Figures", "", "![accuracy per round](accuracy.png)", "", "![accuracy vs bytes](accuracy_bytes.png)", ""]
    if figures.strip():
        lines += [figures.strip(), ""]
    return "\n".join(lines)


def _metric_label(metric_a: str, metric_b: str) -> str:
    unit = " (points)" if metric_scale(metric_a) == 100 else ""
    return (f"`{metric_a}`" if metric_a == metric_b else f"`{metric_a}` vs `{metric_b}`") + unit


def write_readme_index() -> Path:
    """benchmarks/README.md: every benchmark's claims with their verdicts, from committed results."""
    lines = ["# Benchmarks", "",
             "Generated by `benchmarks/runner.py` from the committed `results.json` files; the protocol is "
             "`../shared/specs/BENCHMARKS.md` (one runner, converged runs with centralized and Local bounds, "
             "≥ 3 seeds, claims evaluated by code, committed sweeps). Rerun a benchmark with "
             "`.venv/bin/python -m benchmarks.<name>` (add `--quick` for a few-minute smoke profile).", "",
             "| benchmark | claim | setting | metric | verdict | mean diff | seeds |", "|---|---|---|---|---|---|---|"]
    others, declared = [], []
    for d in sorted(p for p in BENCHMARKS.iterdir() if p.is_dir() and not p.name.startswith("_")):
        f = d / "results.json"
        data = json.loads(f.read_text()) if f.exists() else {}
        if "claims" not in data or not isinstance(data.get("runs"), list) or not data["runs"] or "final_accuracy" not in data["runs"][0]:
            main_py = d / "__main__.py"
            (declared if main_py.exists() and "benchmarks.runner" in main_py.read_text() else others).append(d.name)
            continue
        for c in data["claims"]:
            md = "—" if c["mean_diff"] is None else f"{metric_scale(c['metric_a']) * c['mean_diff']:+.2f}"
            kind = " (diagnostic)" if c.get("diagnostic") else ""
            lines.append(f"| [{d.name}]({d.name}/results.md) | `{c['statement']}`{kind} | {c['setting']} | "
                         f"{_metric_label(c['metric_a'], c['metric_b'])} | {c['verdict']} | {md} | {len(c['seeds'])} |")
    for name in declared:  # their claims, as declared, until a full run commits results
        for c in importlib.import_module(f"benchmarks.{name}").make(False).claims:
            lines.append(f"| [{name}]({name}/__init__.py) | `{c.statement}` | {c.setting} | "
                         f"{_metric_label(c.metric_a or c.metric, c.metric_b or c.metric)} | not yet run | — | — |")
    if declared:
        lines += ["", "Declared on the runner but not yet run under the protocol (no committed results; earlier, "
                  "pre-protocol results, where there were any, are under the benchmark's `previous/`): "
                  + ", ".join(f"[{n}]({n}/__init__.py) (`python -m benchmarks.{n}`)" for n in declared) + "."]
    if others:
        lines += ["", "Not under the protocol (timing, transport and demo measurements; their own pages describe "
                  "what they measured and how): " + ", ".join(f"[{n}]({n}/)" for n in others) + "."]
    out = BENCHMARKS / "README.md"
    out.write_text("\n".join(lines) + "\n")
    return out


# -- entry point ----------------------------------------------------------------------------------
def main(make: Callable[[bool], Benchmark], argv: Sequence[str] | None = None) -> dict[str, Any]:
    """``python -m benchmarks.<name> [--quick] [--workers N] [--report-only] [--only ROLE]``."""
    p = argparse.ArgumentParser(description="Run a benchmark declared for benchmarks/runner.py.")
    p.add_argument("--quick", action="store_true", help="the small profile, into runs/bench-quick/<name>")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="parallel cells (default: cores)")
    p.add_argument("--report-only", action="store_true", help="rewrite results from cached cells; run nothing")
    p.add_argument("--only", choices=("sweep", "bound", "grid"), help="run only these cells (the rest must be cached to report)")
    p.add_argument("--out", type=Path, help="results directory (default: the benchmark's folder)")
    args = p.parse_args(argv)
    bench = make(args.quick)
    out = args.out or (ROOT / "runs" / "bench-quick" / bench.name if args.quick else BENCHMARKS / bench.name)
    out.mkdir(parents=True, exist_ok=True)
    cache = Cache(out / "cells", bench.record_extras)
    command = bench.command or f"python -m benchmarks.{bench.name}" + (" --quick" if args.quick else "")
    before = machine()
    cells = bench.all_cells()
    if args.only:
        cells = [c for c in cells if c.role == args.only]
    if args.report_only:
        missing = [c for c in cells if cache.get(c) is None]
        if missing:
            print(f"{len(missing)} cells are not cached yet (e.g. {missing[0].label}); reporting what exists is not possible")
            return {}
    else:
        if bench.prepare is not None and any(cache.get(c) is None for c in cells):
            bench.prepare()
        run_cells(cells, cache, workers=max(1, args.workers), keep_server_metrics=bench.keep_server_metrics)
    every = bench.all_cells()
    records = {c: cache.get(c) for c in every}
    missing = [c for c, r in records.items() if r is None]
    if missing:
        print(f"{len(missing)} cells still to run; results not written")
        return {}
    results = build_results(bench, records, before, machine(), command)
    if args.report_only and (out / "results.json").exists():
        # a report rewritten from cached cells: the machine and code are those of the run that made them
        previous = json.loads((out / "results.json").read_text())
        results["machine"], results["code"] = previous.get("machine", results["machine"]), previous.get("code", results["code"])
    (out / "results.json").write_text(json.dumps(_clean(results), indent=1) + "\n")
    plot_results(results, out)
    figures = bench.figures(results, out) if bench.figures is not None else ""
    (out / "results.md").write_text(results_markdown(bench, results, figures))
    if not args.quick and args.out is None:
        write_readme_index()
    for c in results["claims"]:
        print(f"{c['verdict']:>14}: {c['statement']} [{c['setting']}]")
    print(f"results: {out / 'results.md'}")
    return results
