"""CPU per round of edgefl in memory (the overhead benchmark's ``edgefl_memory`` workload:
bench-echo, 10 devices, 1,000 floats): two versions round by round in one process, checkouts
side by side, and where a round's CPU goes.

    git -C /work/main worktree add --detach /tmp/base BASE    # the version to compare with
    nice -n 19 .venv/bin/python benchmarks/overhead/investigations/memory_round.py \
        --paired /tmp/base --rounds 400                        # this checkout against /tmp/base
    nice -n 19 .venv/bin/python benchmarks/overhead/investigations/memory_round.py \
        /tmp/base . --rounds 300 --repetitions 6               # one process per run, alternating
    nice -n 19 .venv/bin/python benchmarks/overhead/investigations/memory_round.py \
        --profile . --rounds 300                               # cProfile of the rounds only

Run from the root of the checkout to measure (``PYTHONPATH=.`` if edgefl is installed from
another one).

``--paired BASE`` (the measurement to trust on a shared machine): BASE's ``edgefl`` package is
copied, its imports renamed (``edgefl_base``), next to BASE's bench-echo workload, and the two
versions run the workload in one process, in two threads that take turns round by round: BASE's
round 1, this checkout's round 1, BASE's round 2, ... Each round's CPU is the thread's own
(``time.thread_time``) around ``RoundLoop.run_round`` (what a record's ``round_seconds`` times),
so both versions meet the same machine at the same moments: on a machine whose other work comes
and goes, CPU time per process moved by ±30 % from run to run (the same code: 2.8 to 4.8 ms a
round), which separate processes cannot tell from a change. ``--functions`` adds the thread CPU
spent inside chosen functions (and what they call) in each version, per round. Printed: the
median CPU per round of each version over rounds 3..R, the median of the pairwise differences,
and the median ``round_seconds`` of each (wall time: it includes the other thread's turn only
where they overlap, i.e. never by design, but it moves with the machine's load).

Positional checkouts: each repetition runs the workload once per checkout, in that order, each
in a fresh process whose ``PYTHONPATH`` and working directory are the checkout; around every
``run_round`` the process reads its CPU time (``time.process_time``) and the wall clock; printed
per run the median, mean and 10th percentile of the CPU per round, the median ``round_seconds``
and the CPU between two records (the round plus the record's handling: rounds.jsonl, the
checkpoint).

``--profile`` runs one checkout under cProfile, enabled only inside ``run_round`` from the
third round on, and prints per round the functions with the most own time and the most time
below them. cProfile adds its own cost to every Python call, so read its shares, not its
microseconds.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SKIP = 2  # rounds not counted (the first rounds warm caches up)
#: --functions' default: the in-memory transport's checks, the device's handling, the exchange
FUNCTIONS = ("wire.envelope:checked_size", "runtime.agent:DeviceAgent.handle",
             "runtime.loop:RoundLoop.exchange", "runtime.loop:RoundLoop.run_round")


def config(package: str, devices: int, floats: int, rounds: int, out_dir: Path, name: str):
    """``benchmarks.overhead.run.edgefl_config`` for the edgefl package named ``package``."""
    algorithms = importlib.import_module(f"{package}.algorithms")
    resolve = importlib.import_module(f"{package}.config").resolve_config
    explicit = {
        "algorithm": "bench-echo", "options": {"floats": str(floats)}, "dataset": "synthetic",
        "clients": devices, "min_devices": devices, "rounds": rounds, "eval_every": 0,
        "steps": 1, "test_samples": 50, "eval_samples": 50, "min_size": 5,
        "out_dir": str(out_dir), "run_name": name,
    }
    return resolve(explicit, dict(algorithms.get_algorithm("bench-echo").defaults))


def once(devices: int, floats: int, rounds: int, profile: bool) -> dict:
    """One run in this process (the checkout on ``sys.path``)."""
    import benchmarks.overhead.echo  # noqa: F401  (registers bench-echo)
    from edgefl.runtime import loop as loop_module
    from edgefl.runtime.simulation import simulate

    cpu: list[float] = []
    wall: list[float] = []
    marks: list[float] = []
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
    original = loop_module.RoundLoop.run_round

    def run_round(self, round):
        on = profiler is not None and round >= SKIP
        c0, t0 = time.process_time(), time.perf_counter()
        if on:
            profiler.enable()
        try:
            return original(self, round)
        finally:
            if on:
                profiler.disable()
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - t0)

    records: list[dict] = []

    def on_round(record: dict) -> None:
        marks.append(time.process_time())
        records.append(record)

    loop_module.RoundLoop.run_round = run_round
    try:
        with tempfile.TemporaryDirectory(prefix="edgefl-memory-round-") as work:
            cfg = config("edgefl", devices, floats, rounds, Path(work), f"mr{os.getpid()}")
            simulate(cfg, on_round=on_round, plots=False)
    finally:
        loop_module.RoundLoop.run_round = original
    if any(r["failed"] or len(r["completed"]) < devices for r in records):
        raise RuntimeError("a round lost a device")
    counted = cpu[SKIP:rounds]
    between = [b - a for a, b in zip(marks[SKIP:], marks[SKIP + 1:], strict=False)]
    out = {
        "cpu_us_median": 1e6 * statistics.median(counted),
        "cpu_us_mean": 1e6 * statistics.fmean(counted),
        "cpu_us_p10": 1e6 * statistics.quantiles(counted, n=10)[0],
        "round_seconds_median_ms": 1e3 * statistics.median(r["round_seconds"]
                                                           for r in records[SKIP:]),
        "cpu_us_between_records": 1e6 * statistics.fmean(between),
        "rounds": len(counted),
        "load": os.getloadavg()[0],
    }
    if profiler is not None:
        import io
        import pstats

        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        for key, n in (("tottime", 35), ("cumtime", 45)):
            stats.sort_stats(key).print_stats(n)
        out["profile"] = text.getvalue()
        out["profiled_rounds"] = rounds - SKIP
    return out


def in_checkout(checkout: Path, args: argparse.Namespace, profile: bool = False) -> dict:
    """:func:`once` in a fresh process that imports from ``checkout``."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--once", "--devices",
           str(args.devices), "--floats", str(args.floats), "--rounds", str(args.rounds)]
    if profile:
        cmd.append("--with-profile")
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run(cmd, cwd=checkout, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.splitlines()[-1])


# --- two versions in one process ----------------------------------------------------------------

_IMPORT = re.compile(r"^(\s*(?:from|import)\s+)edgefl(?=[.\s])", re.M)


def renamed_copy(base: Path, into: Path) -> None:
    """``base``'s edgefl package as ``into/edgefl_base`` (its imports renamed) and its bench-echo
    workload as ``into/echo_base.py`` (importing edgefl_base)."""
    shutil.copytree(base / "edgefl", into / "edgefl_base",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for path in [*(into / "edgefl_base").rglob("*.py"), into / "echo_base.py"]:
        if path.name == "echo_base.py":
            text = (base / "benchmarks" / "overhead" / "echo.py").read_text()
        else:
            text = path.read_text()
        path.write_text(_IMPORT.sub(r"\1edgefl_base", text))


class Turns:
    """Two threads taking turns, round by round; a thread done with its rounds waits no more and
    makes nobody wait."""

    def __init__(self, names: list[str]):
        self.names, self.turn, self.done = names, 0, set()
        self.cond = threading.Condition()

    def wait(self, me: int) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.turn == me or (1 - me) in self.done)

    def passed(self, me: int, last: bool) -> None:
        with self.cond:
            if last:
                self.done.add(me)
            self.turn = 1 - me
            self.cond.notify_all()


def _wrap_functions(package: str, names: list[str], spent: dict[str, list[float]]) -> None:
    """Count the thread CPU spent inside each ``module:qualname`` of ``package`` (a function or a
    method, not a class; and what it calls) into ``spent`` (per round: :func:`paired` appends a
    0 to each list at each round)."""
    for spec in names:
        module_name, qualname = spec.split(":")
        module = importlib.import_module(f"{package}.{module_name}")
        owner, attr = module, qualname
        if "." in qualname:
            cls, attr = qualname.split(".")
            owner = getattr(module, cls)
        original = getattr(owner, attr)
        acc = spent.setdefault(spec, [])

        def timed(*args, __f=original, __acc=acc, **kwargs):
            t0 = time.thread_time()
            try:
                return __f(*args, **kwargs)
            finally:
                if __acc:  # not before the first round (the run's setup)
                    __acc[-1] += time.thread_time() - t0

        setattr(owner, attr, timed)
        if owner is module:  # also where other modules imported it by name
            for m in list(sys.modules.values()):
                if (getattr(m, "__name__", "").startswith(package + ".")
                        and getattr(m, attr, None) is original):
                    setattr(m, attr, timed)


def paired(base: Path, devices: int, floats: int, rounds: int, functions: list[str]) -> dict:
    """Both versions in this process, taking turns round by round (see the module's doc)."""
    work = Path(tempfile.mkdtemp(prefix="edgefl-paired-"))
    try:
        renamed_copy(base, work)
        sys.path.insert(0, str(work))
        import benchmarks.overhead.echo  # noqa: F401  (registers bench-echo)

        importlib.import_module("echo_base")
        packages = ["edgefl_base", "edgefl"]
        turns = Turns(packages)
        cpu: dict[str, list[float]] = {p: [] for p in packages}
        records: dict[str, list[dict]] = {p: [] for p in packages}
        spent: dict[str, dict[str, list[float]]] = {p: {} for p in packages}
        errors: list[BaseException] = []

        def side(me: int) -> None:
            package = packages[me]
            try:
                loop_module = importlib.import_module(f"{package}.runtime.loop")
                simulate = importlib.import_module(f"{package}.runtime.simulation").simulate
                _wrap_functions(package, functions, spent[package])
                original = loop_module.RoundLoop.run_round

                def run_round(self, round):
                    turns.wait(me)
                    for acc in spent[package].values():
                        acc.append(0.0)
                    c0 = time.thread_time()
                    try:
                        return original(self, round)
                    finally:
                        cpu[package].append(time.thread_time() - c0)
                        turns.passed(me, last=round == rounds - 1)

                loop_module.RoundLoop.run_round = run_round
                cfg = config(package, devices, floats, rounds, work / package, "paired")
                simulate(cfg, on_round=records[package].append, plots=False)
            except BaseException as e:  # noqa: BLE001  (reported by the main thread)
                errors.append(e)
                turns.passed(me, last=True)

        threads = [threading.Thread(target=side, args=(i,), name=p)
                   for i, p in enumerate(packages)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out: dict = {"load": os.getloadavg()[0], "rounds": rounds - SKIP}
    for p in packages:
        if any(r["failed"] or len(r["completed"]) < devices for r in records[p]):
            raise RuntimeError(f"{p}: a round lost a device")
        out[p] = {
            "cpu_us_median": 1e6 * statistics.median(cpu[p][SKIP:]),
            "cpu_us_mean": 1e6 * statistics.fmean(cpu[p][SKIP:]),
            "round_seconds_median_ms": 1e3 * statistics.median(
                r["round_seconds"] for r in records[p][SKIP:]),
            "functions_us_median": {f: 1e6 * statistics.median(v[SKIP:])
                                    for f, v in spent[p].items()},
        }
    base_cpu, new_cpu = cpu["edgefl_base"][SKIP:], cpu["edgefl"][SKIP:]
    out["difference_us_median"] = 1e6 * statistics.median(
        n - b for b, n in zip(base_cpu, new_cpu, strict=True))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkouts", nargs="*", help="repository roots to compare")
    ap.add_argument("--paired", type=Path, metavar="BASE",
                    help="this checkout against BASE's edgefl, round by round, in one process")
    ap.add_argument("--functions", nargs="*", default=list(FUNCTIONS),
                    help="with --paired: module:qualname under edgefl to time "
                    "(default: %(default)s)")
    ap.add_argument("--devices", type=int, default=10)
    ap.add_argument("--floats", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--repetitions", type=int, default=6)
    ap.add_argument("--profile", action="store_true", help="cProfile the (one) checkout's rounds")
    ap.add_argument("--once", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--with-profile", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.once:
        print(json.dumps(once(args.devices, args.floats, args.rounds, args.with_profile)))
        return
    if args.paired:
        res = paired(args.paired.resolve(), args.devices, args.floats, args.rounds,
                     args.functions)
        print(f"{res['rounds']} rounds each, taking turns; load {res['load']:.2f} at the end")
        for p, label in (("edgefl_base", f"base {args.paired}"), ("edgefl", "this checkout")):
            r = res[p]
            print(f"  {label}: CPU a round median {r['cpu_us_median']:.0f} µs (mean "
                  f"{r['cpu_us_mean']:.0f}), round_seconds median "
                  f"{r['round_seconds_median_ms']:.3f} ms")
            for f, us in r["functions_us_median"].items():
                print(f"      {f}: {us:.0f} µs a round")
        print(f"  this checkout - base, median of the pairs: {res['difference_us_median']:+.0f} µs")
        return
    checkouts = [Path(c).resolve() for c in args.checkouts] or [Path.cwd()]
    if args.profile:
        res = in_checkout(checkouts[0], args, profile=True)
        print(f"{checkouts[0]}: {res['profiled_rounds']} rounds profiled, "
              f"{res['cpu_us_median']:.0f} µs CPU a round under the profiler")
        print(res["profile"])
        return
    seen: dict[Path, list[dict]] = {c: [] for c in checkouts}
    for rep in range(args.repetitions):
        for c in checkouts:
            res = in_checkout(c, args)
            seen[c].append(res)
            print(f"rep {rep} {c}: run_round CPU median {res['cpu_us_median']:.0f} µs "
                  f"(mean {res['cpu_us_mean']:.0f}, p10 {res['cpu_us_p10']:.0f}), round_seconds "
                  f"median {res['round_seconds_median_ms']:.3f} ms, CPU between records "
                  f"{res['cpu_us_between_records']:.0f} µs, load {res['load']:.2f}", flush=True)
    print("median over repetitions:")
    for c, runs in seen.items():
        print(f"  {c}: run_round CPU {statistics.median(r['cpu_us_median'] for r in runs):.0f} µs"
              f", round_seconds {statistics.median(r['round_seconds_median_ms'] for r in runs):.3f}"
              f" ms, between records "
              f"{statistics.median(r['cpu_us_between_records'] for r in runs):.0f} µs")


if __name__ == "__main__":
    main()
