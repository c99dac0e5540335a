"""Side-by-side check of two edgefl checkouts on the 10-device Mosquitto echo workload.

    git worktree add /tmp/old <commit>
    .venv/bin/python benchmarks/overhead/ab.py /tmp/old 10      # then the same with /work/main

Prints, for the checkout at ROOT: wall time per round (checkpointing included), the CPU the whole
machine was busy per round (all processes: server, broker, devices; from /proc/stat), the server
process's CPU per round, and the median orchestration overhead (as run.py defines it). Rounds 3..N
only (the first rounds include start-up). Alternate the two checkouts a few times: single runs vary
by ±2 ms on this 2-core machine.
"""

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(sys.argv[1]).resolve()
sys.path.insert(0, str(ROOT))

from benchmarks.overhead import run as bench  # noqa: E402
from edgefl.runtime import server as server_module  # noqa: E402


def busy_jiffies() -> int:
    values = list(map(int, open("/proc/stat").readline().split()[1:]))
    return sum(values) - values[3] - values[4]  # minus idle and iowait


def main() -> None:
    devices = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 42
    marks = []
    serve = server_module.serve

    def observed(cfg, opts, on_round=None):
        def hook(record):
            marks.append((time.perf_counter(), busy_jiffies(), time.process_time()))
            if on_round:
                on_round(record)

        return serve(cfg, opts, on_round=hook)

    server_module.serve = observed
    work = Path(tempfile.mkdtemp(prefix="edgefl-ab-"))
    try:
        result = bench.run_edgefl_mqtt("mosquitto", devices, 1000, rounds, devices, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (t0, b0, c0), (t1, b1, c1) = marks[2], marks[-1]
    n, hz = len(marks) - 3, os.sysconf("SC_CLK_TCK")
    print(
        f"{ROOT} devices={devices}: wall {1000 * (t1 - t0) / n:.2f} ms/round, machine busy {1000 * (b1 - b0) / hz / n:.2f} ms CPU/round, "
        f"server {1000 * (c1 - c0) / n:.2f} ms CPU/round, overhead median {1000 * statistics.median(result['overhead_seconds_per_round'][2:]):.2f} ms"
    )


if __name__ == "__main__":
    main()
