"""Every core: the in-memory simulation sequential against worker processes, side by side.

    python -m benchmarks.scale.parallel [--workers N] [--workload demo|fedavg]

For each workload it runs the same configuration four times in this one invocation, back to back:
sequentially (one process, torch's default threads: every core for one device at a time, as a
user runs it), sequentially on one torch thread (one core), on ``--workers`` worker processes
(default: one per core, one torch thread each) and on as many Ray actors (a local Ray started for
the run; skipped when Ray is not installed), and records wall time, the rounds' device phase
(``collect_seconds``) and server phase (``aggregate_seconds``), accuracy, and the machine's load
before each run. Speed-ups are against the default sequential run; the one-thread run shows how
much of the second core torch's own intra-op threads already use. Writes
``benchmarks/scale/parallel.json`` and ``parallel.md``. Identical results at equal threads per
device are a test (``tests/test_parallel.py``), not this benchmark: here the sequential run uses
every core per device, as a user would run it.

Workloads:

* ``demo``: ``make demo``'s run in memory: Velo, 20 devices of 5 ResNet depths, Dir(0.5), 18,000
  images, 12 rounds of 3 local epochs, the lr ×0.1 from round 10, the CVAE trained every second
  round (its server step runs in the server process between rounds, so it bounds the speed-up:
  Amdahl).
* ``fedavg``: 20 devices, 12,000 images (the demo's data before its budget grew), Dir(0.5), FedAvg
  on CNN tier 2 (a server step of milliseconds).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time
from pathlib import Path

from benchmarks.common import machine, write_json
from benchmarks.demo import FLEET
from benchmarks.runner import code_version
from benchmarks.timing import command_line

HERE = Path(__file__).resolve().parent

DEMO = {
    **FLEET,
    "lr": 0.003,
    "lr_decay_rounds": (9,),
    "train_samples": 18000,
    "epochs": 3,
    "test_samples": 2000,
    "eval_every": 2,
    "eval_samples": 1000,
    "seed": 0,
    "options": {"cvae_interval": "2"},
}
WORKLOADS = {
    "demo": DEMO,
    # (without the demo's lr decay and Velo option: this workload was measured before they were the
    # demo's)
    "fedavg": {
        **{k: v for k, v in DEMO.items() if k not in ("lr_decay_rounds", "options", "epochs")},
        "algorithm": "fedavg",
        "model": "cnn",
        "tiers": ("2",),
        "lr": 0.003,
        "optimizer": "adam",
        "train_samples": 12000,
    },
}


def run_once(explicit: dict, workers: int, out: Path, name: str, *, backend: str = "processes",
             threads: int | None = None) -> dict:
    import torch

    from edgefl.algorithms import get_algorithm
    from edgefl.config import resolve_config
    from edgefl.runtime.simulation import simulate

    algo = get_algorithm(explicit["algorithm"])
    extra = {"threads": threads} if threads else {}
    cfg = resolve_config(
        {**explicit, **extra, "out_dir": str(out), "run_name": name}, dict(algo.defaults)
    )
    load = [round(x, 2) for x in os.getloadavg()]
    rounds: list[dict] = []
    before = torch.get_num_threads()
    t0 = time.perf_counter()
    try:
        summary = simulate(cfg, rounds.append, plots=False, workers=workers, backend=backend)
    finally:
        # a one-thread run must not leave the next run's server on one thread
        torch.set_num_threads(before)
    wall = time.perf_counter() - t0
    return {
        "backend": backend,
        "threads": threads,
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
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run sequential and parallel this many times, alternating; speed-ups are the median "
        "of the pairs",
    )
    args = p.parse_args(argv)
    command = command_line("benchmarks.scale.parallel", argv)
    results = {"machine": machine(), "command": command, "workloads": {}}
    # re-measuring some workloads keeps the others' runs
    if args.workload and (HERE / "parallel.json").exists():
        results["workloads"] = json.loads((HERE / "parallel.json").read_text())["workloads"]
    for name in args.workload or ["fedavg", "demo"]:
        explicit = WORKLOADS[name]
        # sequential and parallel alternate (a drifting machine load hits both alike), then the
        # others once
        runs = [
            run
            for _ in range(max(1, args.repeats))
            for run in (
                ("sequential", 1, "processes", None),
                ("parallel", args.workers, "processes", None),
            )
        ]
        runs.append(("sequential_one_thread", 1, "processes", 1))
        if importlib.util.find_spec("ray") is not None:  # Ray is an optional extra
            runs.append(("ray", args.workers, "ray", None))
        entry: dict = {
            "config": explicit,
            "machine": machine(),
            "command": command,
            "code": code_version(),
        }
        measured: dict[str, list[dict]] = {}
        for key, workers, backend, threads in runs:
            print(
                f"{name}: {key} ({workers} worker(s), backend {backend}, threads "
                f"{threads or 'default'})…",
                flush=True,
            )
            measured.setdefault(key, []).append(
                run_once(
                    explicit, workers, args.out, f"{name}-{key}", backend=backend, threads=threads
                )
            )
            print(f"  {measured[key][-1]}", flush=True)
        entry.update(summarize(measured))
        results["workloads"][name] = entry
    write_json(HERE / "parallel.json", results)
    (HERE / "parallel.md").write_text(report(results))
    return results


def summarize(measured: dict[str, list[dict]]) -> dict:
    """Each run kind's record (the median over its repeats, with every repeat kept under
    ``repeats``) and its speed-ups against the sequential run: the median over pairs (repeat i
    against sequential repeat i; a kind run once against the median sequential run)."""
    import statistics

    def median_run(rs: list[dict]) -> dict:
        if len(rs) == 1:
            return dict(rs[0])
        out = dict(rs[0])
        for k in ("wall_seconds", "device_phase_seconds", "server_phase_seconds"):
            out[k] = round(statistics.median(r[k] for r in rs), 2)
        return {**out, "repeats": rs}

    seqs = measured["sequential"]
    entry = {key: median_run(rs) for key, rs in measured.items()}
    for key, rs in measured.items():
        if key == "sequential":
            continue
        pairs = (
            list(zip(seqs, rs, strict=True))
            if len(rs) == len(seqs)
            else [(entry["sequential"], r) for r in rs]
        )
        ratios = [s["wall_seconds"] / r["wall_seconds"] for s, r in pairs]
        phase = [s["device_phase_seconds"] / r["device_phase_seconds"] for s, r in pairs]
        entry[key]["speedup"] = round(statistics.median(ratios), 3)
        entry[key]["device_phase_speedup"] = round(statistics.median(phase), 3)
        if len(ratios) > 1:
            entry[key]["speedups"] = [round(x, 3) for x in ratios]
    seq = entry["sequential"]
    entry["server_share_sequential"] = round(seq["server_phase_seconds"] / seq["wall_seconds"], 3)
    return entry


def report(results: dict) -> str:
    m = results["machine"]
    lines = [
        "# In-memory simulation: sequential against worker processes and Ray actors",
        "",
        f"On {m['cores']} cores ({m['cpu']}); each workload's date, command and code are under "
        "the table. The runs of a "
        "workload ran back to back in one invocation; the load average before each run is "
        "recorded next to it (with "
        "`--repeats N`, sequential and parallel alternate N times: their rows give the median run "
        "and each run's wall "
        "time, the speed-up is the median over the pairs). Sequential: one process, "
        "torch's default threads (every core for one device at a time, as a user runs it; the "
        "reference of every "
        "speed-up), then the same on one torch thread. Workers and Ray actors: one per core, one "
        "torch thread each; "
        "the server's step runs in the driver process on torch's default threads. Worker "
        "processes are forked from a "
        "fork server that imports torch once per invocation (`edgefl.runtime.processes`; until "
        "2026-11-25 each worker was "
        "spawned and imported torch itself, about 2 s): its start-up is in the first parallel "
        "run's wall time, as the "
        "benchmark process's own torch import is outside the sequential runs'. Ray: a local Ray "
        "started for the "
        "run (its start-up is in the wall time).",
        "",
        "| workload | run | wall (s) | speed-up | device phase (s) | device phase speed-up | "
        "server phase (s) | accuracy % | load before |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    labels = {
        "sequential": "sequential, default threads",
        "sequential_one_thread": "sequential, 1 thread",
        "parallel": "{w} worker processes",
        "ray": "{w} Ray actors",
    }
    for name, w in results["workloads"].items():
        for key, label in labels.items():
            if key not in w:
                continue
            r = w[key]
            speed = "1 (reference)" if key == "sequential" else f"**{r['speedup']:.2f}×**"
            if r.get("speedups"):
                speed += f" (pairs: {', '.join(f'{x:.2f}' for x in r['speedups'])})"
            if r.get("repeats"):
                walls = ", ".join(f"{x['wall_seconds']:.0f}" for x in r["repeats"])
                label += f" (median of {len(r['repeats'])}: {walls} s)"
            dspeed = "1" if key == "sequential" else f"{r['device_phase_speedup']:.2f}×"
            lines.append(
                f"| {name} | {label.format(w=r['workers'])} | {r['wall_seconds']:.1f} | {speed} | "
                f"{r['device_phase_seconds']:.1f} | "
                f"{dspeed} | {r['server_phase_seconds']:.1f} | {100 * r['mean_accuracy']:.2f} | "
                f"{r['loadavg_before'][0]} |"
            )
    lines.append("")
    for name, w in results["workloads"].items():
        wm = w.get("machine", m)
        par, share = w["parallel"], w["server_share_sequential"]
        bound = 1 / (share + (1 - share) / par["workers"])
        lines.append(
            f"- **{name}**: measured {wm['date']} by `{w.get('command', results['command'])}` at "
            "code "
            f"`{w.get('code') or results.get('code') or 'unknown'}`. The server's step is "
            f"{100 * share:.0f} % of the "
            "sequential wall time: with the devices' phase perfectly parallel, Amdahl's bound on "
            f"{par['workers']} "
            f"workers is {bound:.2f}×; measured {par['speedup']:.2f}× (device phase "
            f"{par['device_phase_speedup']:.2f}×)."
        )
    lines += [
        "",
        "The server's step runs in the server process while the workers wait, so a workload's "
        "speed-up is "
        "bounded by its server share (Amdahl). Accuracies differ only where the thread counts per "
        "device differ "
        "(floating-point reductions); at equal threads the runs are identical "
        "(tests/test_parallel.py).",
        "",
        "Each run here starts its workers. `python -m benchmarks.scale.parallel_reuse` "
        "alternates the sequential run with workers started once per process and reused, on the "
        "fedavg CNN workload at 10 devices and 2 rounds (it writes `parallel_reuse.md`).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
