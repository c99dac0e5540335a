"""The one benchmark runner (../shared/specs/BENCHMARKS.md): a benchmark is a declaration.

A benchmark module builds a :class:`Benchmark` — its grid of :class:`Cell` (method × setting ×
seed, each one ``edgefl.runtime.simulation.simulate`` call), its bounds, its :class:`Sweep` of
open defaults (on a validation split carved from the training data) and its :class:`Claim` —
and hands it to :func:`main`. The runner does the rest:

- runs the cells in parallel worker processes (up to the core count), each cell on one torch
  thread so the machine is never oversubscribed and a cell gives the same numbers whichever
  worker runs it, alone or beside others;
- caches every finished cell as ``<benchmark>/cells/<key>-<code hash>.json``: the key a hash of the
  cell's full configuration, the code hash one of the code the cell runs
  (:mod:`benchmarks.provenance`), so an interrupted benchmark resumes, a finished one is only
  re-reported and a code change never reuses a cell; it refuses to run a cell from code that
  differs from its commit unless asked for a draft (``--draft``);
- evaluates the claims in code (paired by seed; mean difference, sd of the differences, sign per
  seed) in one vocabulary: **reproduced** (mean beyond 2 sd, every seed agreeing), **not
  reproduced** (with the measured numbers), **reversed** (significantly the other way), **not
  comparable** (with the reason: too few seeds, not converged — the last-quarter slope of a
  method's mean curve over the seeds at or above 0.5 points per 10 % of rounds —, collapsed runs,
  failed bounds). Non-inferiority rows ("not worse than": mean above −1 sd) are their own kind and
  never count as a paper's claim;
- applies the sanity gates of :mod:`benchmarks.gates` (bounds, collapsed runs) and marks claims over
  cells produced before the benchmark's committed ``declared.json`` (its main settings);
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
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import gates, provenance
from benchmarks.common import machine

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = Path(__file__).resolve().parent
#: Converged: the per-round accuracy moved less than this many points per 10 % of rounds over the
#: last quarter of the run (BENCHMARKS.md).
SLOPE_LIMIT = 0.5
#: Bumped when a cell's record format changes (part of every cache key).
RECORD_VERSION = 1
#: What a claim is. Counted as the paper's claims: "paper" (the claim as the paper makes it) and
#: "control" (decides whether a gain is the method's: a claim, BENCHMARKS.md). "implied": every
#: method against Local and FedAvg, a row the paper implies; "not worse": a non-inferiority row;
#: "construction": true by construction (shown, nothing to reproduce); "diagnostic": a measured
#: explanation.
KINDS = {"paper": "the paper's claim", "control": "control (counted as a claim)", "implied": "implied by the paper",
         "not worse": "not worse than", "construction": "true by construction", "diagnostic": "diagnostic"}
COUNTED = ("paper", "control")
VERDICTS = ("reproduced", "not reproduced", "reversed", "not comparable")


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
    #: one of :data:`KINDS`; "paper", "control" and "implied" are strict (> or <), "not worse" weak (≥ or ≤)
    kind: str = "paper"
    #: the paper's own number for the claim (its table, dataset and setting), shown beside the verdict
    paper: str = ""
    #: the earlier spelling of kind="diagnostic" (kept for declarations written before the kinds)
    diagnostic: bool = False

    def __post_init__(self):
        if self.diagnostic:
            object.__setattr__(self, "kind", "diagnostic")
        if self.kind not in KINDS:
            raise ValueError(f"claim {self.id}: kind {self.kind!r} is not one of {sorted(KINDS)}")
        op = self.parse()[1]
        if self.kind in ("paper", "control", "implied") and op not in (">", "<"):
            raise ValueError(f"claim {self.id}: a claim of improvement is strict (> or <); "
                             f"a non-inferiority check is kind='not worse'")
        if self.kind == "not worse" and op not in ("≥", "≤"):
            raise ValueError(f"claim {self.id}: a 'not worse' row reads ≥ or ≤")

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
    #: the paper the claims come from (benchmarks/README.md's line "claims reproduced: k of n")
    paper: str = ""

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
    # asynchronous buffered aggregation (issue 39): rounds
    "aggregation": "sync", "buffer": None,
}


def resolved_run(cell: Cell) -> dict[str, Any]:
    """The run configuration ``simulate`` will use (output and thread settings aside), with the
    method's options resolved."""
    blob = json.dumps(cell.full_config(), sort_keys=True, default=list)
    if blob not in _RESOLVED:
        from edgefl.algorithms import get_algorithm
        from edgefl.config import resolve_config
        from edgefl.runtime.setup import resolve_method

        algorithm = get_algorithm(cell.config.get("algorithm", "fedavg"))
        cfg = resolve_config(cell.full_config(), dict(algorithm.defaults))
        options = resolve_method(cfg.algorithm, cfg.options).options_dict()  # the dp options too, when set
        run = cfg.model_dump(mode="json", exclude={"out_dir", "run_name", "threads", "options"})
        run = {k: v for k, v in run.items() if not (k in ADDED_SETTINGS and v == ADDED_SETTINGS[k])}
        added = ADDED_OPTIONS.get(cfg.algorithm, {})
        run["options"] = {k: v for k, v in options.items() if not (k in added and v == added[k])}
        _RESOLVED[blob] = run
    return _RESOLVED[blob]


def _worker_init() -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import threading

    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT))
    os.chdir(ROOT)  # a configuration's relative paths (FedVTC's oracle) name files of the repository
    parent = os.getppid()

    def orphaned() -> None:  # a killed benchmark must not leave its cells running
        while os.getppid() == parent:
            time.sleep(2)
        os._exit(1)

    threading.Thread(target=orphaned, daemon=True).start()


def run_cell(cell: Cell, keep_server_metrics: Sequence[str] = (), record_extras: str | None = None,
             tmp_root: str | None = None, progress: bool = False, draft: bool = False) -> dict[str, Any]:
    """Run one cell in this process and return its record (what results.json keeps per run);
    its run directory lives under ``tmp_root`` (the system's temporary folder by default) while it
    runs; ``progress`` prints a line per round."""
    import torch

    from edgefl.algorithms import get_algorithm
    from edgefl.config import resolve_config
    from edgefl.report.recorder import read_rounds
    from edgefl.runtime.simulation import simulate

    torch.set_num_threads(1)
    cfg_dict = cell.full_config()
    if tmp_root is not None:
        Path(tmp_root).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="edgefl-bench-", dir=tmp_root) as tmp:
        explicit = {**cfg_dict, "out_dir": tmp, "run_name": "run", "threads": 1}
        cfg = resolve_config(explicit, dict(get_algorithm(explicit.get("algorithm", "fedavg")).defaults))
        t0 = time.perf_counter()
        server: list[Any] = []

        def on_round(r: dict[str, Any]) -> None:
            acc = (r.get("eval") or {}).get("mean_accuracy")
            phase = r.get("phase", "train")
            step = f"round {r.get('round')}/{cfg.rounds}" if phase == "train" else f"{phase} round"  # from 1
            print(f"  {cell.label} {step}" + (f": {100 * acc:.2f} %" if acc is not None else "")
                  + f" ({time.perf_counter() - t0:.0f} s)", flush=True)

        summary = simulate(cfg, on_round if progress else None, plots=False, on_done=server.append)
        wall = time.perf_counter() - t0
        rounds = read_rounds(Path(tmp) / "run")
        record = make_record(cell, resolved_run(cell), summary, rounds, wall, keep_server_metrics)
        record.update(code=provenance.code_version(record_extras), code_hash=provenance.code_hash(record_extras),
                      draft=draft, finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"), **predictions(cfg, Path(tmp) / "run"))
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
        entry: dict[str, Any] = {"round": r["round"]}  # rounds.jsonl counts from 1
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
    }


def predictions(cfg: Any, run_dir: Path) -> dict[str, Any]:
    """What the collapse gate reads (:mod:`benchmarks.gates`): per device, its training images per
    class (``client_class_counts``) and how often its final model predicts each class on the test
    set (``client_predictions``); ``{}`` where the run saved no device models (a single device)."""
    import torch

    from edgefl.export.checkpoint import load_device_model
    from edgefl.runtime.setup import assemble

    built = assemble(cfg)
    data = built.data
    if data.parts is None:
        return {}
    counts, preds = {}, {}
    test = data.evals["test"]
    for i, device in enumerate(built.ids):
        counts[device] = [int(x) for x in data.shard(i).class_counts()]
        try:
            model = load_device_model(run_dir, device)
        except Exception:  # noqa: BLE001 - a run without saved models: only the class counts
            continue
        with torch.no_grad():
            p = torch.cat([model(x).argmax(1) for x, _ in test.batches(1000, shuffle=False)])
        preds[device] = torch.bincount(p, minlength=data.info.num_classes).tolist()
    return {"client_class_counts": counts, **({"client_predictions": preds} if preds else {})}


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


#: the commit (``+dirty`` where the code differs from it) a measurement runs at: the timing benchmarks' record
code_version = provenance.code_version


class DirtyCode(RuntimeError):
    """Cells would run from code that differs from its commit (``--draft`` allows it)."""


class Cache:
    """Finished cells as JSON files named ``<key>-<code hash>.json`` (:mod:`benchmarks.provenance`).

    :meth:`get` (what a run reuses) answers only a record of the same configuration *and* code,
    never a draft unless the cache is a draft's; :meth:`find` (what a report reads) also answers
    one from other code, newest first, and last a record cached before code hashes existed
    (``<key>.json``, pre-provenance), each marked so on the page. With ``record_extras`` a record
    made without that hook is a miss (it lacks the metrics the claims name)."""

    def __init__(self, directory: Path, record_extras: str | None = None, *, code_hash: str | None = None,
                 draft: bool = False):
        self.dir = Path(directory)
        self.record_extras = record_extras
        self.code_hash = code_hash or provenance.code_hash(record_extras)
        self.draft = draft

    def path(self, cell: Cell) -> Path:
        return self.dir / f"{cell.key}-{self.code_hash}.json"

    def _load(self, cell: Cell, path: Path) -> dict | None:
        record = json.loads(path.read_text())
        if record.get("extras_from") != self.record_extras:
            return None
        # the same configuration run for another label (a sweep value that is also a grid cell)
        return {**record, "method": cell.method, "setting": cell.setting, "role": cell.role}

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
        tmp.write_text(json.dumps(_clean(record), indent=1) + "\n")
        tmp.replace(self.path(cell))  # atomic: an interrupted write never leaves half a record


def run_cells(cells: Sequence[Cell], cache: Cache, *, workers: int, keep_server_metrics: Sequence[str] = (),
              log: Callable[[str], None] = lambda m: print(m, flush=True), tmp_root: Path | None = None,
              progress: bool = False) -> list[dict]:
    """Every cell's record, running the ones not in the cache (``workers`` processes at a time).
    Refuses (:class:`DirtyCode`) to run a cell from code that differs from its commit unless the
    cache is a draft's; run directories live under ``tmp_root`` while their cell runs."""
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
    version = provenance.code_version(cache.record_extras)
    if todo and provenance.is_dirty(version) and not cache.draft:
        raise DirtyCode(f"{len(todo)} cells would run from code at {version}: the edgefl package or the benchmark's "
                        "module differs from the commit. Commit first, or ask for a draft (--draft), whose cells are "
                        "marked and never reused by a run that is not a draft")
    if todo:
        t0 = time.perf_counter()
        import multiprocessing as mp

        with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"), initializer=_worker_init) as pool:
            tmp = None if tmp_root is None else str(tmp_root)
            pending = {pool.submit(run_cell, c, tuple(keep_server_metrics), cache.record_extras, tmp, progress, cache.draft): c
                       for c in todo}
            done_count = 0
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    cell = pending.pop(fut)
                    record = fut.result()  # a failing cell stops the benchmark: it is a bug
                    if record.get("code_hash") != cache.code_hash:
                        raise RuntimeError(f"{cell.label}: the code changed while the benchmark ran (hash "
                                           f"{record.get('code_hash')} against {cache.code_hash} at the start)")
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


def statistic(op: str, diffs: Sequence[float]) -> tuple[str, float, float]:
    """(what the paired differences alone say, mean, sd): for > and <, "reproduced" (mean beyond
    2 sd the claimed way, every seed agreeing), "reversed" (the same, the other way) or "not
    reproduced"; for ≥ and ≤ (a "not worse" row), "not worse" (mean above −1 sd; below +1 sd for
    ≤) or "worse"."""
    mean = statistics.fmean(diffs)
    sd = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
    sign = 1 if op in (">", "≥") else -1
    m, ds = sign * mean, [sign * d for d in diffs]
    if op in ("≥", "≤"):
        return ("not worse" if (m > -sd if sd > 0 else m >= 0) else "worse"), mean, sd
    if m > 2 * sd and all(d > 0 for d in ds):
        return "reproduced", mean, sd
    if m < -2 * sd and all(d < 0 for d in ds):
        return "reversed", mean, sd
    return "not reproduced", mean, sd


def evaluate_claim(claim: Claim, runs: Iterable[Mapping[str, Any]], *, collapsed: Mapping[str, Sequence[str]] | None = None,
                   gate_failures: Sequence[str] = ()) -> dict[str, Any]:
    """A claim's verdict (:data:`VERDICTS`; "not worse" / "worse" for a "not worse" row) with its
    ``reason``: the measured numbers where it is not reproduced, why where it is not comparable
    (no runs, a metric missing, fewer than 3 seeds, not converged, collapsed runs — ``collapsed``
    maps :func:`benchmarks.gates.run_id` to reasons —, a failed gate). ``statistic`` is what the
    paired differences alone say."""
    a, op, b = claim.parse()
    metric_a, metric_b = claim.metric_a or claim.metric, claim.metric_b or claim.metric
    runs = list(runs)
    by = {(r["method"], r["setting"], r["seed"]): r for r in runs if r.get("role", "grid") == "grid"}
    seeds = sorted({s for (m, st, s) in by if m == a and st == claim.setting} & {s for (m, st, s) in by if m == b and st == claim.setting})
    out = {
        "id": claim.id, "statement": claim.statement, "a": a, "b": b, "op": op, "setting": claim.setting,
        "metric": claim.metric, "metric_a": metric_a, "metric_b": metric_b, "seeds": seeds, "note": claim.note,
        "kind": claim.kind, "paper": claim.paper,
    }
    empty = {"mean_diff": None, "sd": None, "signs": [], "converged": False, "holds": False, "statistic": None}
    if not seeds:
        return {**out, **empty, "verdict": "not comparable", "reason": "no runs"}
    try:
        diffs = [metric_value(by[(a, claim.setting, s)], metric_a) - metric_value(by[(b, claim.setting, s)], metric_b) for s in seeds]
    except MetricMissing as e:
        return {**out, **empty, "verdict": "not comparable", "reason": f"metric missing: {e.args[0]}", "missing": str(e.args[0])}
    stat, mean, sd = statistic(op, diffs)
    signs = [int(math.copysign(1, d)) if d != 0 else 0 for d in diffs]
    per_method = {m: [by[(m, claim.setting, s)].get("slope") for s in seeds] for m in dict.fromkeys((a, b))}
    slopes = [x for xs in per_method.values() for x in xs]
    # A method's slope is that of its mean curve over the seeds (the mean of the runs' slopes): the
    # protocol reads a claim where every compared *method* has flattened. One run's least-squares
    # slope over a noisy last quarter (half participation swings a curve by 1–2 points per
    # evaluation) has a standard error near the limit itself, so the largest of ten such slopes
    # crosses it by chance in runs that have converged; the mean over seeds averages that noise out.
    method_slopes = [None if None in xs else statistics.fmean(xs) for xs in per_method.values()]
    converged = all(x is not None and abs(x) < SLOPE_LIMIT for x in method_slopes)
    # collapsed runs among the compared ones (a derived run's are its sources')
    fallen = []
    for s in seeds:
        for m in dict.fromkeys((a, b)):
            r = by[(m, claim.setting, s)]
            sources = [(x, r["derived_from"][2]) for x in r["derived_from"][:2]] if r.get("derived_from") else [(m, claim.setting)]
            for src_m, src_s in sources:
                why = (collapsed or {}).get(f"{src_m}|{src_s}|{s}")
                if why:
                    fallen.append(f"{src_m} seed {s} ({'; '.join(why)})")
    fallen = list(dict.fromkeys(fallen))
    scale = metric_scale(metric_a)
    unit = " points" if scale == 100 else ""
    measured = (f"{scale * mean:+.2f} ± {scale * sd:.2f}{unit} (mean ± sd of {len(diffs)} paired differences), "
                f"{sum(1 for x in signs if x == (1 if op in ('>', '≥') else -1))} of {len(signs)} seeds the claimed way")
    why = []  # every reason the runs cannot answer, most basic first
    if gate_failures:
        why.append("the benchmark fails its sanity gates: " + "; ".join(gate_failures))
    if fallen:
        why.append("collapsed runs: " + "; ".join(fallen))
    if len(seeds) < 3:
        why.append(f"{len(seeds)} seed(s), the protocol reads ≥ 3")
    if not converged:
        worst = max((abs(x) for x in method_slopes if x is not None), default=None)
        why.append("not converged: method slope " + ("unknown" if worst is None else f"{worst:.2f}")
                   + f" ≥ {SLOPE_LIMIT} points per 10 % of rounds")
    verdict = "not comparable" if why else stat
    reason = " | ".join(why) + f" (the numbers alone: {stat}; {measured})" if why else measured
    return {**out, "mean_diff": mean, "sd": sd, "diffs": diffs, "signs": signs, "statistic": stat,
            "converged": converged, "collapsed_runs": fallen,
            "method_slope": max((abs(x) for x in method_slopes if x is not None), default=None),
            "max_abs_slope": max((abs(x) for x in slopes if x is not None), default=None),
            "holds": verdict in ("reproduced", "not worse"), "verdict": verdict, "reason": reason}


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
                  command: str, *, bench_dir: Path | None = None) -> dict[str, Any]:
    """results.json's content: the runs, the gates, the claims with their verdicts and provenance."""
    grid_runs = [records[c] for c in bench.cells]
    derived = bench.derived(grid_runs) if bench.derived is not None else []
    bound_runs = {name: [records[c] for c in cells] for name, cells in bench.bounds.items()}
    bounds = {name: mean_sd([r["final_accuracy"] for r in rs])[0] for name, rs in bound_runs.items()}
    gate = gates.evaluate(bound_runs, grid_runs)
    claims = [evaluate_claim(c, grid_runs + derived, collapsed=gate["collapsed"], gate_failures=gate["failures"])
              for c in bench.claims]
    sweep_runs = [records[c] for s in bench.sweeps for v in s.grid for c in s.cells[v]]
    current = provenance.code_hash(bench.record_extras)
    every = list({id(r): r for r in grid_runs + [r for rs in bound_runs.values() for r in rs] + sweep_runs}.values())
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
                d = next((x for x in derived if (x["method"], x["setting"], x["seed"]) == (m, c["setting"], s)), None)
                cells += [(x, d["derived_from"][2], s) for x in d["derived_from"][:2]] if d else [(m, c["setting"], s)]
        c["commits"] = sorted({code_of.get(k, "unknown") for k in cells})
        c["counted"] = c["kind"] in COUNTED
        if decl is not None:
            declared = "main" if c["setting"] in decl.get("main", []) else \
                "alternative" if c["setting"] in decl.get("alternatives", []) else "undeclared"
            c["declared"] = declared
            c["counted"] = c["counted"] and declared == "main"
            at = decl.get("declared_at")
            c["before_declaration"] = at is None or any(provenance.contains(x, at) is not True for x in c["commits"])
        # the protocol answers a claim only over cells run at a clean commit after its settings were declared
        unclean = [x for x in c["commits"] if x == "unknown" or x.endswith("+dirty")]
        if c["verdict"] in ("reproduced", "not reproduced", "reversed") and (unclean or c.get("before_declaration")):
            why = [f"cells from a tree that was not a clean commit ({', '.join(unclean)})"] if unclean else []
            why += ["cells run before the settings were declared"] if c.get("before_declaration") else []
            c.update(verdict="not comparable", holds=False, reason=" | ".join([*why, *filter(None, [c.get("reason")])]))
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
        "provenance": {"commits": commits, "cells": status,
                       "declaration": None if decl is None else {k: decl.get(k) for k in ("main", "alternatives", "declared_at", "note")}},
        "runs": grid_runs,
        "derived_runs": derived,
        "claims": claims,
        "sweeps": [evaluate_sweep(s, records) for s in bench.sweeps],
        "sweep_runs": sweep_runs,
    }


def pct(x: float | None, sd: float | None = None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{100 * x:.2f}" + (f" ± {100 * sd:.2f}" if sd is not None and not math.isnan(sd) else "")


def metric_scale(metric: str) -> int:
    """Accuracies (fractions) are shown in points; other metrics (bytes, seconds) as they are."""
    return 100 if "accuracy" in metric or metric.startswith("per_tier") or "agreement" in metric else 1


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
    """results.md (:mod:`benchmarks.pages`)."""
    from benchmarks.pages import results_markdown as page

    return page(bench, results, figures)


def write_readme_index() -> Path:
    """benchmarks/README.md (:mod:`benchmarks.pages`)."""
    from benchmarks.pages import write_readme_index as index

    return index()


def reviewer_cells(bench: Benchmark, methods: Sequence[str], setting: str, seeds: Sequence[int]) -> list[Cell]:
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
            raise SystemExit(f"method {method!r} has no cell in {setting}; there: " + ", ".join(dict.fromkeys(c.method for c in grid)))
        cells += [Cell(method, setting, seed, template.config, template.role) for seed in seeds]
    return cells


def check(bench: Benchmark, methods: Sequence[str], setting: str, seeds: Sequence[int], out: Path, *, workers: int,
          draft: bool = False) -> dict[str, Any]:
    """Run the reviewer's cells into ``out`` (``out/cells``, temporary files under ``out/tmp``) and
    evaluate every claim of the benchmark between the chosen methods in that setting over them
    (collapse gates included; the bounds are not rerun). Writes ``out/check.json``; prints the verdicts."""
    cells = reviewer_cells(bench, methods, setting, seeds)
    cache = Cache(out / "cells", bench.record_extras, draft=draft)
    runs = run_cells(cells, cache, workers=workers, keep_server_metrics=bench.keep_server_metrics,
                     tmp_root=out / "tmp", progress=True)
    claims = [c for c in bench.claims if c.setting == setting and set(c.parse()[::2]) <= set(methods)]
    gate = {"collapsed": gates.collapsed_runs(runs)}  # the bounds are not rerun: only the collapse gate applies
    verdicts = [evaluate_claim(c, runs, collapsed=gate["collapsed"]) for c in claims]
    result = {"benchmark": bench.name, "setting": setting, "methods": list(methods), "seeds": list(seeds),
              "code": provenance.code_version(bench.record_extras), "code_hash": cache.code_hash, "gates": gate,
              "claims": verdicts, "runs": [{k: r.get(k) for k in ("method", "setting", "seed", "final_accuracy", "code")} for r in runs]}
    (out / "check.json").write_text(json.dumps(_clean(result), indent=1) + "\n")
    for r in runs:
        print(f"{r['method']:>20} seed {r['seed']}: {100 * r['final_accuracy']:.2f} %")
    if not verdicts:
        print(f"no claim of {bench.name} compares only {', '.join(methods)} in {setting}")
    for c in verdicts:
        print(f"{c['verdict']:>15}: {c['statement']} [{c['setting']}] ({KINDS[c['kind']]}): {c['reason']}")
    print(f"check: {out / 'check.json'}")
    return result


# -- entry point ----------------------------------------------------------------------------------
def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def main(make: Callable[[bool], Benchmark], argv: Sequence[str] | None = None) -> dict[str, Any]:
    """``python -m benchmarks.<name> [--quick] [--workers N] [--report-only] [--only ROLE] [--draft]
    [--cells A,B --setting S --seeds 1,2,3] [--out DIR]``."""
    p = argparse.ArgumentParser(description="Run a benchmark declared for benchmarks/runner.py.")
    p.add_argument("--quick", action="store_true", help="the small profile, into runs/bench-quick/<name>")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="parallel cells (default: cores)")
    p.add_argument("--report-only", action="store_true", help="rewrite results from cached cells; run nothing")
    p.add_argument("--only", choices=("sweep", "bound", "grid"), help="run only these cells (the rest must be cached to report)")
    p.add_argument("--out", type=Path, help="results directory (default: the benchmark's folder)")
    p.add_argument("--draft", action="store_true",
                   help="allow cells to run from code that differs from its commit (marked draft, never reused otherwise)")
    p.add_argument("--cells", type=_csv, help="the reviewer's check: these methods (comma-separated) of one --setting")
    p.add_argument("--setting", help="the reviewer's check: the setting of --cells")
    p.add_argument("--seeds", type=lambda t: [int(x) for x in _csv(t)], help="the reviewer's check: seeds, comma-separated")
    args = p.parse_args(argv)
    bench = make(args.quick)
    if args.cells or args.setting or args.seeds:
        if not (args.cells and args.setting and args.seeds):
            p.error("the reviewer's check needs --cells, --setting and --seeds together")
        out = (args.out or ROOT / "runs" / "check" / bench.name).resolve()
        out.mkdir(parents=True, exist_ok=True)
        if out == (BENCHMARKS / bench.name).resolve():
            p.error("the reviewer's check writes into a folder of its own, not the committed results")
        try:
            return check(bench, args.cells, args.setting, args.seeds, out, workers=max(1, args.workers), draft=args.draft)
        except DirtyCode as e:
            raise SystemExit(str(e)) from None
    out = (args.out or (ROOT / "runs" / "bench-quick" / bench.name if args.quick else BENCHMARKS / bench.name)).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cache = Cache(out / "cells", bench.record_extras, draft=args.draft)
    command = bench.command or f"python -m benchmarks.{bench.name}" + (" --quick" if args.quick else "")
    before = machine()
    cells = bench.all_cells()
    if args.only:
        cells = [c for c in cells if c.role == args.only]
    every = bench.all_cells()
    if args.report_only:
        records = {c: cache.find(c) for c in every}
    else:
        if bench.prepare is not None and any(cache.get(c) is None for c in cells):
            bench.prepare()
        try:
            run_cells(cells, cache, workers=max(1, args.workers), keep_server_metrics=bench.keep_server_metrics,
                      tmp_root=out / "tmp")
        except DirtyCode as e:
            raise SystemExit(str(e)) from None
        records = {c: cache.get(c) for c in every}
    missing = [c for c, r in records.items() if r is None]
    if missing:
        print(f"{len(missing)} cells are not cached yet (e.g. {missing[0].label}); results not written")
        return {}
    results = build_results(bench, records, before, machine(), command, bench_dir=BENCHMARKS / bench.name)
    if args.report_only and (out / "results.json").exists():
        # a report rewritten from cached cells: the machine is that of the run that made them
        previous = json.loads((out / "results.json").read_text())
        results["machine"] = previous.get("machine", results["machine"])
    (out / "results.json").write_text(json.dumps(_clean(results), indent=1) + "\n")
    plot_results(results, out)
    figures = bench.figures(results, out) if bench.figures is not None else ""
    (out / "results.md").write_text(results_markdown(bench, results, figures))
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
