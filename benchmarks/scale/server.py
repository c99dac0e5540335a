"""The server's work per round against the number of devices, for every method.

    python -m benchmarks.scale.server [--devices 10 100 1000] [--method NAME ...]

For each method at its defaults (model family, tiers, width, options) and each fleet size N, every
device of the round reports (fraction 1): the uplinks are real — one device per tier trains one
local step on Fashion-MNIST and its update stands for every device of that tier (with that device's
sample count) — and the server computes every device's downlink and aggregates the N uplinks. The
time of round 1 (round 0 may build buffers) and the server process's resident memory after it are
recorded; the exponent b of time ≈ a·N^b is fitted over N (b ≈ 1: linear). The same training
data at every N, so the server's public share (HierarchyFL's labelled 1 %, FedHeNN's alignment
pool) is the same and only N changes. Time is the process's CPU time at one torch thread (what
the server's work costs, whatever else the machine runs; wall seconds are kept beside it).
Devices' own work is not measured here (see ``parallel.py``). Writes
``benchmarks/scale/server.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path

import psutil

from benchmarks.common import fit_exponent, machine, write_json
from benchmarks.timing import command_line

HERE = Path(__file__).resolve().parent


def measure(method: str, n: int, train_samples: int) -> dict:
    from edgefl.algorithms import DeviceRecord, get_algorithm
    from edgefl.config import resolve_config
    from edgefl.runtime.setup import assemble
    from edgefl.wire import Payload

    algo = get_algorithm(method)
    cfg = resolve_config(
        {
            "algorithm": method,
            "dataset": "fashion-mnist",
            "clients": n,
            "fraction": 1.0,
            "partition": "iid",
            "train_samples": train_samples,
            "test_samples": 100,
            "eval_samples": 100,
            "steps": 1,
            "rounds": 4,
            "seed": 0,
            "min_size": 2,
        },
        dict(algo.defaults),
    )
    run = assemble(cfg)
    fleet = {
        d: DeviceRecord(spec=run.specs[d], num_samples=len(run.data.shard(i)))
        for i, d in enumerate(run.ids)
    }
    server = run.algorithm.server(run.server_context(fleet), run.options)
    by_tier: dict[str, Payload] = {}
    for d in run.ids:  # one real device per tier
        tier = run.specs[d].tier
        if tier not in by_tier:
            half = run.device_half(d)
            half.receive(0, server.downlink(0, d))
            by_tier[tier] = half.fit(0)
    rss0 = psutil.Process().memory_info().rss
    timings = []
    for rnd in (0, 1):
        server.ctx.round = rnd
        t0, c0 = time.perf_counter(), time.process_time()
        for d in run.ids:
            server.downlink(rnd, d)
        t1 = time.perf_counter()
        uplinks = {}
        for d in run.ids:
            up = by_tier[run.specs[d].tier]
            uplinks[d] = Payload(
                up.arrays,
                {
                    **up.meta,
                    "num_samples": min(int(up.meta.get("num_samples", 1)), fleet[d].num_samples),
                },
            )
        metrics = server.aggregate(rnd, uplinks)
        t2, c2 = time.perf_counter(), time.process_time()
        timings.append((t1 - t0, t2 - t1, c2 - c0))
    down, agg, cpu = timings[-1]
    upload = sum(a.nbytes for p in by_tier.values() for a in p.arrays.values()) / len(by_tier)
    out = {
        "method": method,
        "devices": n,
        "downlink_seconds": round(down, 4),
        "aggregate_seconds": round(agg, 4),
        "server_seconds": round(down + agg, 4),
        "server_cpu_seconds": round(cpu, 4),
        "rss_mb": round(psutil.Process().memory_info().rss / 2**20, 1),
        "rss_growth_mb": round((psutil.Process().memory_info().rss - rss0) / 2**20, 1),
        "uplink_bytes_per_device": int(upload),
        "server_metrics": sorted(metrics)[:8],
        "public_pool": len(run.data.public) if run.data.public is not None else 0,
    }
    del server, run, by_tier, uplinks
    gc.collect()
    return out


def merge(earlier: dict, new: dict) -> dict:
    """``new``'s methods replace theirs in ``earlier``; every row keeps the run (command, load) it
    came from."""
    def stamped(res):
        return [
            {
                **r,
                "run": r.get("run")
                or {
                    "command": res["command"],
                    "date": res["machine"]["date"],
                    "load_before": res["machine"]["loadavg_1_5_15"],
                    "load_after": res.get("machine_after"),
                },
            }
            for r in res["rows"]
        ]

    redone = set(new["exponents"])
    rows = [r for r in stamped(earlier) if r["method"] not in redone] + stamped(new)
    exponents = {m: b for m, b in earlier["exponents"].items() if m not in redone} | new[
        "exponents"
    ]
    return {**new, "rows": rows, "exponents": exponents, "merged": True}


def main(argv: list[str] | None = None) -> dict:
    from edgefl.algorithms import algorithm_names

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, nargs="+", default=[10, 100, 1000])
    p.add_argument("--method", action="append", help="default: every method")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)  # CPU time = the work of one core
    methods = args.method or [m for m in algorithm_names() if m != "local"]
    results = {"machine": machine(), "command": command_line("benchmarks.scale.server", argv),
               "rows": [], "exponents": {}}
    # the same data at every N, so the server's public share (HierarchyFL's labelled 1 %, FedHeNN's
    # alignment pool and with it the kernel size) does not grow with the fleet: only N does
    train_samples = max(4000, 20 * max(args.devices))
    results["train_samples"] = train_samples
    for m in methods:
        for n in args.devices:
            row = measure(m, n, train_samples)
            print(row, flush=True)
            results["rows"].append(row)
        pts = [(r["devices"], r["server_cpu_seconds"]) for r in results["rows"] if r["method"] == m]
        results["exponents"][m] = fit_exponent(pts)
    results["machine_after"] = machine()["loadavg_1_5_15"]
    # a rerun of some methods: keep the others' rows
    if args.method and (HERE / "server.json").exists():
        results = merge(json.loads((HERE / "server.json").read_text()), results)
    write_json(HERE / "server.json", results)
    (HERE / "server.md").write_text(report(results, args.devices))
    return results


def report(results: dict, devices: list[int]) -> str:
    m = results["machine"]
    head = " | ".join(f"N = {n} (CPU s)" for n in devices)
    lines = [
        "# Server work per round against the number of devices",
        "",
        f"`{results['command']}` on {m['cores']} cores, {m['date']}; load average before "
        f"{m['loadavg_1_5_15']}, "
        f"after {results['machine_after']}. Every device of the round reports; the server "
        "computes each "
        "device's downlink and aggregates the N uplinks (round 1; real uplinks, one trained "
        "device per tier; "
        f"{results.get('train_samples', '?')} training images at every N, so the server's public "
        "share is the same). "
        "Time: the server process's CPU seconds for the round at one torch thread (robust to the "
        "machine's "
        "load; wall seconds are in server.json). b: the fitted exponent of time ≈ a·N^b.",
        "",
        f"| method | {head} | b | memory at the largest N (MB) | uplink per device |",
        "|---|" + "---|" * len(devices) + "---|---|---|",
    ]
    for method, b in results["exponents"].items():
        rows = {r["devices"]: r for r in results["rows"] if r["method"] == method}
        cells = " | ".join(
            f"{rows[n].get('server_cpu_seconds', rows[n]['server_seconds']):.3f}"
            if n in rows
            else "—"
            for n in devices
        )
        last = rows[max(rows)]
        lines.append(
            f"| {method} | {cells} | {b:.2f} | {last['rss_mb']:.0f} | "
            f"{last['uplink_bytes_per_device'] / 1e3:.1f} kB |"
            if b is not None
            else f"| {method} | {cells} | — | {last['rss_mb']:.0f} | — |"
        )
    if results.get("merged"):
        runs = {json.dumps(r["run"], sort_keys=True): r["run"] for r in results["rows"]}
        lines += [
            "",
            "Rows come from more than one invocation (a rerun of some methods replaces their "
            "rows):",
        ]
        for run in runs.values():
            methods = sorted({r["method"] for r in results["rows"] if r["run"] == run})
            lines.append(
                f"- `{run['command']}` ({run['date']}, load before {run['load_before']}, after "
                f"{run['load_after']}): {', '.join(methods)}"
            )
    lines += [
        "",
        "Targets (issue 22): every method's server step ≤ 5 s per round at 10 devices, growing at "
        "most "
        "linearly (b ≤ 1); Felo-sized knowledge aggregated for 1,000 devices in under 1 s.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
