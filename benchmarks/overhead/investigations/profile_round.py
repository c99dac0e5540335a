"""Where the CPU of a round goes, function by function: the server and every device process of
the 10-device echo workload over Mosquitto, profiled with yappi (CPU clock, every thread).

    nice -n 10 .venv/bin/python -m benchmarks.overhead.investigations.profile_round \
        --devices 10 --floats 1000 --rounds 150 --out /tmp/profile

Runs the ``edgefl mqtt`` variant of ``benchmarks.overhead.run`` (bench-echo, one device per
process up to 10 processes) against a fresh Mosquitto on 127.0.0.1. The server (this process)
and each device process profile every thread with yappi's CPU clock from their third round on
(a device: from its third request), and save their statistics as pstats files in ``--out``
(``server.pstat``, ``device-<pid>.pstat``, and one file per thread beside each); printed: per
round, the functions with the most own CPU (``tottime``) and the most CPU below them
(``cumtime``), for the server and for one device, all threads and each thread.
A profiler adds its own cost to every Python call (yappi roughly doubles a small function's),
so the shares, not the absolute microseconds, are what to read; ``cpu_ab`` measures changes.
yappi is a development tool, not a dependency of edgefl: ``pip install yappi``.
"""

from __future__ import annotations

import argparse
import os
import pstats
import sys
import tempfile
import threading
from pathlib import Path

try:
    import yappi
except ImportError:  # a development tool only
    sys.exit("profile_round needs yappi: pip install yappi")

OUT_ENV = "EDGEFL_PROFILE_OUT"
SKIP = 2  # rounds (a device: requests) before profiling starts


def _start() -> None:
    yappi.set_clock_type("cpu")
    yappi.set_context_name_callback(lambda: threading.current_thread().name)
    yappi.start(builtins=True, profile_threads=True)


def _save(path: Path, rounds: int) -> None:
    """All threads in ``path``; each thread's own in ``path``'s stem + ``.<thread name>``."""
    if yappi.is_running():
        yappi.stop()
    paths = [(path, yappi.get_func_stats())]
    for thread in yappi.get_thread_stats():
        name = "".join(c if c.isalnum() or c in "-_" else "_" for c in thread.name)
        stats = yappi.get_func_stats(filter={"ctx_id": thread.id})  # ctx_id=0 would mean all
        if not stats.empty():
            paths.append((path.with_name(f"{path.stem}.{name}-{thread.id}.pstat"), stats))
    for where, stats in paths:
        stats.save(str(where), type="pstat")
        where.with_suffix(".rounds").write_text(str(rounds))


def device_main(spec: str) -> None:
    """A device process of the benchmark (``benchmarks.overhead.device_main``), profiled."""
    from benchmarks.overhead import device_main as devices
    from edgefl.runtime.device import DeviceRuntime

    served = [0]
    original = DeviceRuntime._serve

    def serve(self, routing, data):
        served[0] += 1
        if served[0] == SKIP + 1:
            yappi.clear_stats()
        return original(self, routing, data)

    DeviceRuntime._serve = serve
    sys.argv = [sys.argv[0], spec]
    _start()
    try:
        devices.main()
    finally:
        _save(Path(os.environ[OUT_ENV]) / f"device-{os.getpid()}.pstat", served[0] - SKIP)


def server_main(args: argparse.Namespace) -> None:
    import edgefl.runtime.server as server_module
    from benchmarks.common import spawn_devices, stop_processes
    from benchmarks.overhead import run as bench
    from edgefl.runtime.server import ServeOptions
    from edgefl.transport.broker import MosquittoBroker

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("*.pstat"), *out.glob("*.rounds")]:
        old.unlink()
    rounds = [0]

    def hook(record):
        rounds[0] += 1
        if rounds[0] == SKIP:
            yappi.clear_stats()
        elif rounds[0] == args.rounds:  # not the end of the run (its report, plots)
            yappi.stop()

    with tempfile.TemporaryDirectory(prefix="edgefl-profile-") as work:
        broker = MosquittoBroker(workdir=Path(work) / "mosquitto").start()
        env = {**os.environ, OUT_ENV: str(out)}
        fleet = f"prof{os.getpid()}"
        specs = bench.device_specs(broker.url, fleet, args.devices)
        procs = spawn_devices("benchmarks.overhead.investigations.profile_round", specs,
                              min(args.devices, 10), Path(work), env=env)
        try:
            _start()
            server_module.serve(
                bench.edgefl_config(args.devices, args.floats, args.rounds, Path(work), "run"),
                ServeOptions(broker=broker.url, fleet=fleet, deadline=600, wait_for_devices=1200),
                on_round=hook)
            _save(out / "server.pstat", rounds[0] - SKIP)
        finally:
            stop_processes(procs, grace=60)
            broker.stop()
    report(out, args.top)


def _per_round(path: Path) -> tuple[pstats.Stats, int]:
    return pstats.Stats(str(path)), int(path.with_suffix(".rounds").read_text())


def _name(func: tuple[str, int, str]) -> str:
    file, line, name = func
    for marker in ("site-packages/", "edgefl/", "benchmarks/", "lib/python3"):
        if marker in file:
            file = file[file.index(marker):]
            break
    return f"{name} ({file}:{line})"


def report(out: Path, top: int) -> None:
    devices = sorted(p for p in out.glob("device-*.pstat") if p.stem[7:].isdigit())
    for path in [*sorted(out.glob("server*.pstat")),
                 *sorted(out.glob(f"{devices[0].stem}*.pstat"))]:
        try:
            stats, rounds = _per_round(path)
        except (OSError, EOFError, ValueError):  # a thread that ran nothing while profiled
            continue
        total = sum(v[2] for v in stats.stats.values())  # own CPU of every function
        if total < 1e-5 * rounds:
            continue
        print(f"\n== {path.name}: {rounds} rounds, {1e3 * total / rounds:.2f} ms of profiled CPU "
              "per round (profiler overhead included)")
        for key, title in ((2, "own CPU (tottime)"), (3, "CPU below (cumtime)")):
            print(f"-- by {title}, µs per round, calls per round")
            rows = sorted(stats.stats.items(), key=lambda kv: kv[1][key], reverse=True)[:top]
            for func, v in rows:
                print(f"{1e6 * v[key] / rounds:9.1f} {v[1] / rounds:7.2f}  {_name(func)}")


def main() -> None:
    if len(sys.argv) == 2 and sys.argv[1].endswith(".json"):
        device_main(sys.argv[1])
        return
    from benchmarks.overhead.investigations import workload_parser

    ap = workload_parser(__doc__)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--out", default="/tmp/edgefl-profile")
    ap.add_argument("--report", action="store_true", help="only print the report of --out")
    args = ap.parse_args()
    if args.report:
        report(Path(args.out), args.top)
    else:
        server_main(args)


if __name__ == "__main__":
    main()
