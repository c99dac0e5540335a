"""A benchmark's cells (../shared/specs/BENCHMARKS.md, "The runner"): what one run is and how it
runs.

A :class:`Cell` is one ``edgefl.runtime.simulation.simulate`` call (method × setting × seed with its
explicit settings); its :attr:`Cell.key` hashes the *resolved* run (the algorithm's defaults and
options filled in), so a changed default never reuses a stale result. :func:`run_cell` runs one cell
in this process, on one torch thread, and returns its record (what results.json keeps per run):
accuracies per round and per tier, the last-quarter slope, bytes, wall time, the code it ran
(:mod:`benchmarks.provenance`), what the collapse gate reads (:func:`predictions`) and what the
benchmark's ``record_extras`` hook adds. Caching and running many cells: :mod:`benchmarks.cache`.
"""

from __future__ import annotations

import hashlib
import importlib
import itertools
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import provenance
from benchmarks.timing import load

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = Path(__file__).resolve().parent
#: Bumped when a cell's record format changes (part of every cache key).
RECORD_VERSION = 1


@dataclass(frozen=True, eq=False)
class Cell:
    """One run: ``config`` is the explicit RunConfig settings (the algorithm's defaults fill the
    rest)."""

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
        blob = json.dumps(
            {"v": RECORD_VERSION, "run": resolved_run(self)}, sort_keys=True, default=list
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def _identity(self) -> tuple:
        return (
            self.role,
            self.method,
            self.setting,
            self.seed,
            json.dumps(self.config, sort_keys=True, default=list),
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Cell) and self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    @property
    def label(self) -> str:
        return f"{self.role}:{self.setting}:{self.method}:s{self.seed}"


@dataclass(frozen=True)
class RunOutput:
    """What a finished cell leaves for a benchmark's ``record_extras`` hook; ``run_dir``
    (config.json, rounds.jsonl, models/) exists only while the hook runs."""

    cell: Cell
    config: Any  # the resolved edgefl.config.RunConfig
    run_dir: Path
    summary: dict[str, Any]
    rounds: list[dict[str, Any]]
    # the run's server half after the last round (e.g. FedVTC's ψ, for sample grids)
    server: Any = None


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
# the classifier trained on the server's class features: off by default
for _method in ("felo", "velo"):
    ADDED_OPTIONS[_method]["server_feature_ce"] = 0.0


def resolved_run(cell: Cell) -> dict[str, Any]:
    """The run configuration ``simulate`` will use (output and thread settings aside), with the
    method's options resolved."""
    blob = json.dumps(cell.full_config(), sort_keys=True, default=list)
    if blob not in _RESOLVED:
        from edgefl.algorithms import get_algorithm
        from edgefl.config import resolve_config, run_key_dump
        from edgefl.runtime.setup import resolve_method

        algorithm = get_algorithm(cell.config.get("algorithm", "fedavg"))
        cfg = resolve_config(cell.full_config(), dict(algorithm.defaults))
        # the dp options too, when set
        options = resolve_method(cfg.algorithm, cfg.options).options_dict()
        run = run_key_dump(cfg, {"out_dir", "run_name", "threads", "options"})
        added = ADDED_OPTIONS.get(cfg.algorithm, {})
        run["options"] = {k: v for k, v in options.items() if not (k in added and v == added[k])}
        _RESOLVED[blob] = run
    return _RESOLVED[blob]


#: where a pool worker's per-round progress lines go (run_cells' queue, printed by the process that
#: runs the benchmark: a worker forked from the fork server has the server's stdout, not the
#: benchmark's); None in the benchmark's own process: printed there
_PROGRESS: Any = None


def _worker_init(progress: Any = None, benchmark: int | None = None) -> None:
    """A pool worker's set-up; ``benchmark``: the process whose death ends this worker (by default
    its parent, which is not the benchmark where the pool forks from a fork server)."""
    global _PROGRESS
    _PROGRESS = progress
    os.environ["OMP_NUM_THREADS"] = "1"
    import threading

    import torch

    torch.set_num_threads(1)
    # (the repository is on this worker's path already: the fork server, or spawn, gives it the
    # parent's sys.path, through which it imported this module to run this initializer)
    # a configuration's relative paths (FedVTC's oracle) name files of the repository
    os.chdir(ROOT)
    parent = os.getppid() if benchmark is None else benchmark

    def orphaned() -> None:  # a killed benchmark must not leave its cells running
        while True:
            try:
                os.kill(parent, 0)
            except ProcessLookupError:
                break
            time.sleep(2)
        os._exit(1)

    threading.Thread(target=orphaned, daemon=True).start()


#: the format of ``started_at`` and ``finished_at`` (local time with its UTC offset)
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S%z"


def now() -> str:
    return time.strftime(TIME_FORMAT)


def new_invocation() -> str:
    """An id for one invocation of a benchmark (``python -m benchmarks.<name>``): its start time and
    process id. Every cell the invocation runs records it (``invocation``), so a page can tell the
    cells of one run from cells of separate runs (:mod:`benchmarks.regeneration`); a later one in
    the same process is numbered."""
    n = next(_INVOCATIONS)
    return f"{now()}-pid{os.getpid()}" + (f"-{n}" if n else "")


_INVOCATIONS = itertools.count()


def run_cell(
    cell: Cell,
    keep_server_metrics: Sequence[str] = (),
    record_extras: str | None = None,
    tmp_root: str | None = None,
    progress: bool = False,
    draft: bool = False,
    invocation: str | None = None,
) -> dict[str, Any]:
    """Run one cell in this process and return its record (what results.json keeps per run);
    its run directory lives under ``tmp_root`` (the system's temporary folder by default) while it
    runs; ``progress`` prints a line per round.

    Besides the run's numbers the record keeps when and how the cell ran, none of it in the cache
    key: ``started_at`` and ``finished_at`` (the whole cell: its set-up, the run, the predictions
    and the ``record_extras`` hook), ``wall_seconds`` and ``cpu_seconds`` (the run alone, as in the
    records before these fields), the machine's 1-minute load at the start and at the end
    (``load_at_start``, ``load_at_end``) and ``invocation`` (the benchmark invocation that ran it,
    :func:`new_invocation`; a fresh one for a cell run on its own)."""
    started_at, load_at_start = now(), load()[0]
    import torch

    from edgefl.algorithms import get_algorithm
    from edgefl.config import resolve_config
    from edgefl.errors import AllDevicesFailed
    from edgefl.report.recorder import read_rounds
    from edgefl.runtime.simulation import simulate

    torch.set_num_threads(1)
    cfg_dict = cell.full_config()
    if tmp_root is not None:
        Path(tmp_root).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="edgefl-bench-", dir=tmp_root) as tmp:
        explicit = {**cfg_dict, "out_dir": tmp, "run_name": "run", "threads": 1}
        cfg = resolve_config(
            explicit, dict(get_algorithm(explicit.get("algorithm", "fedavg")).defaults)
        )
        t0, cpu0 = time.perf_counter(), time.process_time()
        server: list[Any] = []

        def on_round(r: dict[str, Any]) -> None:
            acc = (r.get("eval") or {}).get("mean_accuracy")
            phase = r.get("phase", "train")
            # from 1
            step = f"round {r.get('round')}/{cfg.rounds}" if phase == "train" else f"{phase} round"
            line = (f"  {cell.label} {step}" + (f": {100 * acc:.2f} %" if acc is not None else "")
                    + f" ({time.perf_counter() - t0:.0f} s)")
            if _PROGRESS is None:
                print(line, flush=True)
            else:
                _PROGRESS.put(line)

        try:
            summary = simulate(cfg, on_round if progress else None, plots=False,
                               on_done=server.append)
        except AllDevicesFailed as e:  # the run stopped: recorded as such, not a crash
            summary = stopped_summary(e, read_rounds(Path(tmp) / "run"))
        wall = time.perf_counter() - t0
        rounds = read_rounds(Path(tmp) / "run")
        record = make_record(cell, resolved_run(cell), summary, rounds, wall, keep_server_metrics)
        record.update(
            # this process's CPU time (one torch thread): a cell's cost whatever else the machine
            # runs, where its wall time is not
            cpu_seconds=time.process_time() - cpu0,
            code=provenance.code_version(record_extras),
            code_hash=provenance.code_hash(record_extras),
            draft=draft,
            **({"inputs": inputs} if (inputs := provenance.input_digests(cfg_dict)) else {}),
            invocation=invocation or new_invocation(),
            started_at=started_at,
            load_at_start=load_at_start,
            **predictions(cfg, Path(tmp) / "run"),
        )
        if record_extras:
            extras = dict(
                load_hook(record_extras)(
                    RunOutput(
                        cell, cfg, Path(tmp) / "run", summary, rounds, server[0] if server else None
                    )
                )
            )
            clash = sorted(set(extras) & set(record))
            if clash:
                raise ValueError(
                    f"record_extras {record_extras} returned keys the record already has: {clash}"
                )
            record.update(extras, extras_from=record_extras)
    record.update(finished_at=now(), load_at_end=load()[0])
    return record


#: why a run stopped before its last round (``stop_reason``): every device it asked failed a round
#: (a diverged model, refused uplinks: the run collapsed, :mod:`benchmarks.gates`), or every
#: device's privacy budget was spent (a legitimate end: its accuracy is the fleet's at that point)
ALL_FAILED, BUDGET_SPENT = "every device failed", "privacy budget spent"


def _spent(reason: str) -> bool:
    return "privacy budget spent" in reason


def stopped_summary(stop: Any, rounds: list[dict]) -> dict[str, Any]:
    """The summary of a run the loop ended at a round where every device failed
    (:class:`edgefl.errors.AllDevicesFailed`): the accuracies of its last evaluated round (None
    where no round was evaluated), the round it stopped at (from 1) and why."""
    evaluated = [r for r in rounds if r.get("eval") and r["eval"].get("mean_accuracy") is not None]
    last = evaluated[-1]["eval"] if evaluated else {}
    spent = bool(stop.failed) and all(_spent(x) for x in stop.failed.values())
    return {"mean_accuracy": last.get("mean_accuracy"),
            "tier_accuracy": last.get("tier_accuracy", {}),
            "client_accuracy": last.get("client_accuracy", {}),
            "accuracy_from_round": evaluated[-1]["round"] if evaluated else None,
            "stopped_at_round": stop.round + 1,
            "stop_reason": BUDGET_SPENT if spent else ALL_FAILED,
            "stop_detail": str(stop)}


def budget_stop(rounds: list[dict]) -> int | None:
    """The first training round (from 1) in which no device was asked because every device's
    privacy budget was spent (the server drops such devices; the run idles to its end), or None."""
    for r in rounds:
        privacy = r.get("privacy") or {}
        spent = set(privacy.get("budget_spent") or ())
        if r.get("phase", "train") == "train" and not r.get("selected") and spent \
                and spent >= set(privacy.get("epsilon") or {}):
            return r["round"]
    return None


def make_record(cell: Cell, resolved: dict, summary: dict, rounds: list[dict], wall: float,
                keep_server_metrics: Sequence[str] = ()) -> dict[str, Any]:
    """A run's record. A run that stopped before its last round (``summary`` of
    :func:`stopped_summary`, or rounds where every device's budget was spent: :func:`budget_stop`)
    keeps its last evaluated accuracy and its rounds, with ``stopped_at_round`` and
    ``stop_reason``."""
    train_rounds = [r for r in rounds if r.get("phase", "train") == "train"]
    completed = sum(len(r["completed"]) for r in train_rounds) or 1
    per_round = []
    for r in rounds:
        entry: dict[str, Any] = {"round": r["round"]}  # rounds.jsonl counts from 1
        if "eval" in r:
            entry["accuracy"] = r["eval"]["mean_accuracy"]
            entry["per_tier"] = r["eval"]["tier_accuracy"]
        if r.get("failed"):  # devices whose work the round lost (non-finite, timed out, …)
            entry["failed"] = sorted(r["failed"])
        server = {k: v for k, v in (r.get("server") or {}).items() if k in keep_server_metrics}
        if server:
            entry["server"] = server
        per_round.append(entry)
    stopped = summary.get("stopped_at_round")
    total_rounds = resolved.get("rounds", len(train_rounds)) if stopped else len(train_rounds)
    final = summary["mean_accuracy"]
    if not stopped and total_rounds and per_round and per_round[-1]["round"] == total_rounds \
            and "accuracy" not in per_round[-1]:
        # the final evaluation closes a curve whose last round was not evaluated (eval_every not
        # dividing the rounds): shown, never in the slope (another evaluation set)
        per_round[-1].update(accuracy=final, per_tier=summary["tier_accuracy"], final=True)
    stop: dict[str, Any] = {}
    if stopped:
        keys = ("stopped_at_round", "stop_reason", "stop_detail", "accuracy_from_round")
        stop = {k: summary[k] for k in keys}
    elif (spent := budget_stop(rounds)) is not None:
        stop = {"stopped_at_round": spent, "stop_reason": BUDGET_SPENT,
                "stop_detail": f"round {spent}: every device's privacy budget spent; "
                               "no device trained from then on"}
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
        "final_point_marked": True,  # see curve_points
        "slope": last_quarter_slope(per_round, total_rounds),
        "bytes_up_per_device_round": sum(r["bytes_up_total"] for r in train_rounds) / completed,
        "bytes_down_per_device_round": sum(r["bytes_down_total"] for r in train_rounds) / completed,
        "wall_seconds": wall,
        "config": cell.full_config(),
        "resolved_config": resolved,
        **stop,
    }


def predictions(cfg: Any, run_dir: Path) -> dict[str, Any]:
    """What the collapse gate reads (:mod:`benchmarks.gates`): per device, its training images per
    class (``client_class_counts``) and how often its final model predicts each class on the test
    set (``client_predictions``); ``{}`` where the run saved no device models (a single device)."""
    import torch

    from edgefl.export.checkpoint import load_device_model
    from edgefl.runtime.agent import model_fingerprint
    from edgefl.runtime.setup import assemble

    built = assemble(cfg)
    data = built.data
    if data.parts is None:
        return {}
    counts, preds = {}, {}
    test = data.evals["test"]
    seen: dict[str, list[int]] = {}  # a model held by many devices (FedAvg's) is predicted once
    for i, device in enumerate(built.ids):
        counts[device] = [int(x) for x in data.shard(i).class_counts()]
        try:
            model = load_device_model(run_dir, device)
        except Exception:  # noqa: BLE001 - a run without saved models: only the class counts
            continue
        key = model_fingerprint(model)
        if key not in seen:
            with torch.no_grad():
                p = torch.cat([model(x).argmax(1) for x, _ in test.batches(1000, shuffle=False)])
            seen[key] = torch.bincount(p, minlength=data.info.num_classes).tolist()
        preds[device] = list(seen[key])
    return {"client_class_counts": counts, **({"client_predictions": preds} if preds else {})}


def last_quarter_slope(per_round: list[dict], total_rounds: int) -> float | None:
    """Least-squares slope of accuracy over the last quarter of rounds, in points per 10 % of
    rounds (None with fewer than two evaluations there). Only the per-round evaluations count: a
    point marked ``final`` (the final evaluation closing the curve, on the test split) is another
    evaluation set, whose offset from the per-round one would weigh most on the slope."""
    if not total_rounds:
        return None
    start = total_rounds * 0.75
    pts = [
        (p["round"], p["accuracy"])
        for p in per_round
        if "accuracy" in p and p["round"] >= start and p["accuracy"] is not None
        and not p.get("final")
    ]
    if len(pts) < 2:
        return None
    xs, ys = [p[0] for p in pts], [100 * p[1] for p in pts]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return slope * 0.1 * total_rounds


def curve_points(record: dict) -> list[dict]:
    """A record's per-round points with the final evaluation's point marked ``final``. Records
    made before the loop evaluated the last round on the per-round split (those without
    ``final_point_marked``) closed the curve with the final evaluation unmarked: that point is the
    last round's, equal to ``final_accuracy``, on a run that did not stop early (a run whose
    privacy budget was spent did run to its end), where the per-round split is smaller than the
    test split (on the same images it is the same number)."""
    per_round = record.get("per_round") or []
    if record.get("final_point_marked") or not per_round:
        return per_round
    resolved = record.get("resolved_config") or {}
    last = per_round[-1]
    rounds = resolved.get("rounds")
    test = resolved.get("test_samples")
    evaluated = resolved.get("eval_samples")
    smaller = evaluated is not None and (test is None or evaluated < test)
    if (smaller and rounds is not None and last.get("round") == rounds
            and record.get("stop_reason", BUDGET_SPENT) == BUDGET_SPENT
            and last.get("accuracy") == record.get("final_accuracy")):
        return [*per_round[:-1], {**last, "final": True}]
    return per_round


def legacy_curve(record: dict) -> dict:
    """A record made before the final point was marked (:func:`curve_points`) with that point
    marked and its slope from the per-round evaluations alone; any other record as it is."""
    if record.get("final_point_marked") or not record.get("per_round"):
        return record
    points = curve_points(record)
    rounds = (record.get("resolved_config") or {}).get("rounds") or len(points)
    return {**record, "per_round": points, "slope": last_quarter_slope(points, rounds)}
