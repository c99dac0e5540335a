"""Where the CPU of a round goes: raw paho against edgefl over Mosquitto, alternating.

    nice -n 10 .venv/bin/python -m benchmarks.overhead.investigations.cpu_per_round 10 1000 40

Arguments: devices, float32 values per message, rounds per run (default 10, 1000, 40). Runs the
raw paho floor and edgefl over one Mosquitto (the variants of ``benchmarks.overhead.run``), two
repetitions each, alternating; after every round it reads the CPU time (user + system) of this
process (the server), of every device process and of the broker, and prints, over rounds 3..R,
the wall time per round and the CPU per round of each. The reading itself (psutil over the
child processes, found once per run) costs this process some CPU each round, the same for both
variants.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import psutil

import edgefl.runtime.server as server_module
from benchmarks.overhead import raw_echo
from benchmarks.overhead import run as bench
from benchmarks.timing import load
from edgefl.transport.broker import MosquittoBroker


def main() -> None:
    n, floats, rounds = (int(x) for x in (sys.argv[1:] + ["10", "1000", "40"][len(sys.argv) - 1:]))
    work = Path(tempfile.mkdtemp(prefix="edgefl-cpu-"))
    broker = MosquittoBroker(workdir=work / "mosquitto").start()
    me = psutil.Process()

    kids: list[psutil.Process] = []

    def snap(first: bool) -> tuple[float, float, float, float]:
        if first:  # found once per run: a scan of /proc per round would read every process of
            # the machine and count that as the server's CPU
            kids[:] = [p for p in me.children(recursive=True) if p.pid != broker.proc.pid]
        devices = 0.0
        for p in kids:
            try:
                devices += sum(p.cpu_times()[:2])
            except psutil.Error:
                pass
        mosquitto = sum(psutil.Process(broker.proc.pid).cpu_times()[:2])
        return time.perf_counter(), sum(me.cpu_times()[:2]), devices, mosquitto

    def report(name: str, marks: list) -> None:
        (t0, s0, d0, b0), (t1, s1, d1, b1) = marks[2], marks[-1]
        k = len(marks) - 3
        print(f"{name}: wall {1000 * (t1 - t0) / k:.2f} ms/round; CPU per round: server "
              f"{1000 * (s1 - s0) / k:.2f} ms, devices {1000 * (d1 - d0) / k:.2f} ms, broker "
              f"{1000 * (b1 - b0) / k:.2f} ms; load {load()}", flush=True)

    original_round, original_serve = raw_echo.RawServer.round, server_module.serve
    try:
        for rep in range(2):
            marks: list = []

            def timed_round(self, data, timeout=600.0, marks=marks):
                out = original_round(self, data, timeout)
                marks.append(snap(not marks))
                return out

            raw_echo.RawServer.round = timed_round
            bench.raw_paho(broker.url, n, floats, rounds, 10, f"c{rep}")
            raw_echo.RawServer.round = original_round
            report("raw paho", marks)

            marks = []

            def serve(cfg, opts, on_round=None, marks=marks):
                def hook(record):
                    marks.append(snap(not marks))
                    on_round(record)

                return original_serve(cfg, opts, on_round=hook)

            server_module.serve = serve
            bench.edgefl_mqtt(broker.url, n, floats, rounds, 10, work, f"e{rep}")
            server_module.serve = original_serve
            report("edgefl mqtt", marks)
    finally:
        raw_echo.RawServer.round, server_module.serve = original_round, original_serve
        broker.stop()


if __name__ == "__main__":
    main()
