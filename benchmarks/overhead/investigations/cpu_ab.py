"""CPU per round of edgefl over Mosquitto, two checkouts side by side (alternating, one broker).

    git archive BEFORE | tar -x -C /tmp/before       # a checkout of the code to compare with
    nice -n 10 .venv/bin/python -m benchmarks.overhead.investigations.cpu_ab /tmp/before . \
        --devices 10 --floats 1000 --rounds 150 --repetitions 3

Each repetition runs the ``edgefl mqtt`` variant of ``benchmarks.overhead.run`` (bench-echo,
the devices in up to 10 processes) once per checkout, in that order, each in a fresh process
whose ``PYTHONPATH`` and working directory are the checkout (its server, its device processes and
the benchmark code all come from it), against one Mosquitto on 127.0.0.1. A checkout named
``PATH@3.1.1`` (or ``PATH@5``) runs with that MQTT protocol (``?protocol=`` in the broker URL;
by default edgefl speaks MQTT 5 to Mosquitto, the raw paho floor 3.1.1). After every round the
run's server reads the CPU time (user + system) of itself, of its device processes (found once,
at the first round) and of the broker; printed per checkout and repetition, over rounds 3..R:
the wall time per round and the CPU per round of each. Wall times move with the machine's load;
CPU time much less, which is why this compares CPU. The load average is printed with each run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def once(url: str, broker_pid: int, n: int, floats: int, rounds: int) -> dict:
    """One run in this process (the checkout on ``sys.path``): CPU per round of each part."""
    import psutil

    import edgefl.runtime.server as server_module
    from benchmarks.overhead import run as bench

    me, broker = psutil.Process(), psutil.Process(broker_pid)
    marks: list[tuple[float, float, float, float]] = []
    kids: list[psutil.Process] = []  # the device processes, found once: a scan of /proc per
    # round would read every process of the machine and count that as the server's CPU

    def snap() -> tuple[float, float, float, float]:
        devices = 0.0
        if not kids:
            kids.extend(me.children(recursive=True))
        for p in kids:
            try:
                devices += sum(p.cpu_times()[:2])
            except psutil.Error:
                pass
        return (time.perf_counter(), sum(me.cpu_times()[:2]), devices,
                sum(broker.cpu_times()[:2]))

    original = server_module.serve

    def serve(cfg, opts, on_round=None):
        def hook(record):
            marks.append(snap())
            on_round(record)

        return original(cfg, opts, on_round=hook)

    server_module.serve = serve
    with tempfile.TemporaryDirectory(prefix="edgefl-cpu-ab-") as work:
        bench.edgefl_mqtt(url, n, floats, rounds, 10, Path(work), f"ab{os.getpid()}")
    (t0, s0, d0, b0), (t1, s1, d1, b1) = marks[2], marks[-1]
    k = len(marks) - 3
    return {"wall_ms": 1000 * (t1 - t0) / k, "server_ms": 1000 * (s1 - s0) / k,
            "devices_ms": 1000 * (d1 - d0) / k, "broker_ms": 1000 * (b1 - b0) / k,
            "rounds": k}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkouts", nargs="+", help="repository roots to compare (PATH[@PROTOCOL])")
    ap.add_argument("--devices", type=int, default=10)
    ap.add_argument("--floats", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--once", nargs=2, metavar=("URL", "BROKER_PID"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.once:
        result = once(args.once[0], int(args.once[1]), args.devices, args.floats, args.rounds)
        print(json.dumps(result), flush=True)
        return
    from benchmarks.timing import load
    from edgefl.transport.broker import MosquittoBroker

    with tempfile.TemporaryDirectory(prefix="edgefl-cpu-ab-") as work:
        broker = MosquittoBroker(workdir=Path(work) / "mosquitto").start()
        try:
            for rep in range(args.repetitions):
                for checkout in args.checkouts:
                    path, _, protocol = checkout.partition("@")
                    root = Path(path).resolve()
                    url = broker.url + (f"?protocol={protocol}" if protocol else "")
                    env = {**os.environ, "PYTHONPATH": str(root)}
                    out = subprocess.run(
                        [sys.executable, str(Path(__file__).resolve()), str(root),
                         "--devices", str(args.devices), "--floats", str(args.floats),
                         "--rounds", str(args.rounds), "--once", url,
                         str(broker.proc.pid)],
                        env=env, cwd=root, check=True, capture_output=True, text=True)
                    r = json.loads(out.stdout.strip().splitlines()[-1])
                    total = r["server_ms"] + r["devices_ms"] + r["broker_ms"]
                    print(f"rep {rep} {checkout}: wall {r['wall_ms']:.2f} ms/round; CPU per round: "
                          f"server {r['server_ms']:.2f} ms, devices {r['devices_ms']:.2f} ms, "
                          f"broker {r['broker_ms']:.2f} ms, all {total:.2f} ms "
                          f"({r['rounds']} rounds); load {load()}", flush=True)
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
