"""Every core: the in-memory simulation sequential against worker processes, side by side.

    python -m benchmarks.scale.parallel [--workers N] [--workload demo|fedavg]

For each workload it runs the same configuration twice in this one invocation, back to back:
sequentially (one process, torch's default threads: every core for one device at a time) and on
``--workers`` worker processes (default: one per core, one torch thread each), and records wall
time, the rounds' device phase (``collect_seconds``) and server phase (``aggregate_seconds``),
accuracy, and the machine's load before each run. Writes ``benchmarks/scale/parallel.json`` and
``parallel.md``. Identical results at equal threads per device are a test
(``tests/test_parallel.py``), not this benchmark: here the sequential run uses every core per
device, as a user would run it.

Workloads:

* ``demo``: ``make demo``'s run in memory: Velo, 20 devices of 5 ResNet depths, Dir(0.5), 12,000
  images, 12 rounds (the CVAE's server step runs in the server process between rounds, so it
  bounds the speed-up: Amdahl).
* ``fedavg``: the same fleet and data with FedAvg on CNN tier 2 (a server step of milliseconds).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from benchmarks.common import machine, write_json

HERE = Path(__file__).resolve().parent

DEMO = {
    "algorithm": "velo", "dataset": "fashion-mnist", "clients": 20, "rounds": 12, "partition": "dirichlet",
    "alpha": 0.5, "lr": 0.003, "train_samples": 12000, "test_samples": 2000, "eval_every": 2,
    "eval_samples": 1000, "seed": 0,
}
WORKLOADS = {
    "demo": DEMO,
    "fedavg": {**DEMO, "algorithm": "fedavg", "model": "cnn", "tiers": ("2",), "lr": 0.003, "optimizer": "adam"},
}


def run_once(explicit: dict, workers: int, out: Path, name: str) -> dict:
    from edgefl.algorithms import get_algorithm
    from edgefl.config import resolve_config
    from edgefl.runtime.simulation import simulate

    algo = get_algorithm(explicit["algorithm"])
    cfg = resolve_config({**explicit, "out_dir": str(out), "run_name": name}, dict(algo.defaults))
    load = [round(x, 2) for x in os.getloadavg()]
    rounds: list[dict] = []
    t0 = time.perf_counter()
    summary = simulate(cfg, rounds.append, plots=False, workers=workers)
    wall = time.perf_counter() - t0
    return {
        "workers": workers,
        "wall_seconds": round(wall, 2),
        "device_phase_seconds": round(sum(r["collect_seconds"] for r in rounds), 2),
        "server_phase_seconds": round(sum(r["aggregate_seconds"] for r in rounds), 2),
        "mean_accuracy": summary["mean_accuracy"],
        "loadavg_before": load,
    }


def main(argv: list[str] | None = None) -> dict:
    from edgefl.runtime.parallel import default_workers

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=default_workers())
    p.add_argument("--workload", choices=sorted(WORKLOADS), action="append")
    p.add_argument("--out", type=Path, default=Path("runs/bench-parallel"))
    args = p.parse_args(argv)
    results = {"machine": machine(), "command": "python -m benchmarks.scale.parallel " + " ".join(argv or sys.argv[1:]),
               "workloads": {}}
    for name in args.workload or ["fedavg", "demo"]:
        explicit = WORKLOADS[name]
        print(f"{name}: sequential…", flush=True)
        seq = run_once(explicit, 1, args.out, f"{name}-sequential")
        print(f"  {seq}", flush=True)
        print(f"{name}: {args.workers} workers…", flush=True)
        par = run_once(explicit, args.workers, args.out, f"{name}-workers")
        print(f"  {par}", flush=True)
        results["workloads"][name] = {
            "config": explicit, "sequential": seq, "parallel": par,
            "speedup": round(seq["wall_seconds"] / par["wall_seconds"], 3),
            "device_phase_speedup": round(seq["device_phase_seconds"] / par["device_phase_seconds"], 3),
            "server_share_sequential": round(seq["server_phase_seconds"] / seq["wall_seconds"], 3),
        }
    write_json(HERE / "parallel.json", results)
    (HERE / "parallel.md").write_text(report(results))
    return results


def report(results: dict) -> str:
    m = results["machine"]
    lines = [
        "# In-memory simulation: sequential against worker processes",
        "",
        f"`{results['command']}` on {m['cores']} cores ({m['cpu']}), {m['date']}. Each pair ran back to back in one "
        "invocation; the load average before each run is recorded next to it. Sequential: one process, torch's "
        "default threads (every core for one device at a time). Workers: one process per core, one torch thread each.",
        "",
        "| workload | sequential (s) | workers (s) | speed-up | device phase speed-up | server share (sequential) | accuracy seq / workers | load before |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, w in results["workloads"].items():
        s, p = w["sequential"], w["parallel"]
        lines.append(
            f"| {name} | {s['wall_seconds']:.1f} | {p['wall_seconds']:.1f} ({p['workers']}) | **{w['speedup']:.2f}×** | "
            f"{w['device_phase_speedup']:.2f}× | {100 * w['server_share_sequential']:.0f} % | "
            f"{100 * s['mean_accuracy']:.2f} / {100 * p['mean_accuracy']:.2f} | {s['loadavg_before'][0]} / {p['loadavg_before'][0]} |")
    lines += ["", "The server's step runs in the server process while the workers wait, so a workload's speed-up is "
              "bounded by its server share (Amdahl). Accuracies differ only where the thread counts per device differ "
              "(floating-point reductions); at equal threads the runs are identical (tests/test_parallel.py).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
