"""Where a round's CPU and wake-ups go, thread by thread: edgefl over Mosquitto.

    python -m benchmarks.overhead.investigations.threads_per_round 10 1000 60

Arguments: devices, float32 values per message, rounds (default 10, 1000, 60). Runs the
``edgefl mqtt`` variant of ``benchmarks.overhead.run`` (the devices in up to 10 processes) with
every thread named after its Python name (``prctl``; paho's network threads are
``paho-mqtt-client-…``, the device runtimes ``Thread-N (run_device)``), reads each thread's CPU
time and voluntary context switches from ``/proc`` after every round, and prints, over rounds
3..R, per round: the wall time, the median ``round_seconds``, and the CPU and voluntary context
switches of each kind of thread, summed over the devices (``dev:``) and in this process, the server
(``srv:``). A voluntary switch is a wait that ended: a wake-up.
"""

from __future__ import annotations

import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from benchmarks.common import ROOT, device_specs, stop_processes
from benchmarks.overhead import run as bench
from benchmarks.timing import load

TICKS = os.sysconf("SC_CLK_TCK")


def name_threads() -> None:
    """From now on, every new thread of this process carries its Python name in the kernel."""
    libc = ctypes.CDLL(None)
    start = threading.Thread._bootstrap_inner

    def named(self) -> None:
        libc.prctl(15, self.name[:15].encode(), 0, 0, 0)  # PR_SET_NAME
        start(self)

    threading.Thread._bootstrap_inner = named


def per_thread(pids: list[int]) -> Counter:
    """CPU seconds and voluntary switches of every thread of ``pids``, by side and thread kind."""
    out: Counter = Counter()
    for pid in pids:
        side = "srv" if pid == os.getpid() else "dev"
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except FileNotFoundError:
            continue
        for tid in tids:
            base = f"/proc/{pid}/task/{tid}"
            try:
                kind = Path(f"{base}/comm").read_text().strip().split("-")[0].split(" ")[0]
                stat = Path(f"{base}/stat").read_text().rsplit(")", 1)[1].split()
                status = Path(f"{base}/status").read_text()
            except (FileNotFoundError, ProcessLookupError):
                continue
            switches = int(status.split("voluntary_ctxt_switches:")[1].split()[0])
            out[f"{side}:{kind} cpu"] += (int(stat[11]) + int(stat[12])) / TICKS
            out[f"{side}:{kind} wake-ups"] += switches
    return out


def device_main() -> None:
    """A device process of this investigation: named threads, then the benchmark's devices."""
    name_threads()
    from benchmarks.overhead import device_main as devices

    devices.main()


def main() -> None:
    from edgefl.runtime.server import ServeOptions, serve
    from edgefl.transport.broker import MosquittoBroker

    n, floats, rounds = (int(x) for x in (sys.argv[1:] + ["10", "1000", "60"][len(sys.argv) - 1:]))
    name_threads()
    work = Path(tempfile.mkdtemp(prefix="edgefl-threads-"))
    broker = MosquittoBroker(workdir=work / "mosquitto").start()
    fleet = f"threads{os.getpid()}"
    specs = device_specs(broker.url, fleet, n)
    k = min(n, 10)
    procs = []
    for i in range(k):
        spec = work / f"devices-{i}.json"
        spec.write_text(json.dumps(specs[i::k]))
        with open(work / f"devices-{i}.log", "ab") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-c", "from benchmarks.overhead.investigations.threads_per_round "
                 "import device_main; device_main()", str(spec)],
                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT))
    pids = [p.pid for p in procs] + [os.getpid()]
    marks: list = []
    try:
        serve(bench.edgefl_config(n, floats, rounds, work, "run"),
              ServeOptions(broker=broker.url, fleet=fleet, deadline=600, wait_for_devices=600),
              on_round=lambda r: marks.append((time.perf_counter(), per_thread(pids),
                                               r["round_seconds"])))
    finally:
        stop_processes(procs, grace=60)
        broker.stop()
    (t0, c0, _), (t1, c1, _) = marks[2], marks[-1]
    k = len(marks) - 3
    median = statistics.median(m[2] for m in marks[2:])
    print(f"{n} devices x {4 * floats} bytes: wall {1000 * (t1 - t0) / k:.2f} ms per round, "
          f"round_seconds median {1000 * median:.2f} ms; load {load()}")
    for key in sorted(c1):
        d = (c1[key] - c0.get(key, 0)) / k
        if d:
            print(f"  {key:28s} {1000 * d if key.endswith('cpu') else d:8.2f}"
                  f"{' ms' if key.endswith('cpu') else ''} per round")


if __name__ == "__main__":
    main()
