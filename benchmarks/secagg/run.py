"""Secure aggregation's cost: bytes and server time of a FedAvg round with and without SecAgg, at
10 and 100 devices, in memory (the same round loop, server half and device agents as a run).

    nice -n 10 .venv/bin/python -m benchmarks.secagg.run                 # 10 and 100 devices
    nice -n 10 .venv/bin/python -m benchmarks.secagg.run --devices 10 --rounds 2

Each configuration runs ``--rounds`` rounds of FedAvg on the synthetic dataset (one local step per
round: the training is not what is measured) with the CNN of tier 2 at width 1 (its parameter
count is in the results), every device selected. Per round:

- **bytes**: what the round record counts, down and up, over all the protocol's stages
  (exact wire sizes of every envelope: :func:`edgefl.wire.encoded_size`);
- **server seconds**: this process's CPU time in the round minus its CPU time inside the devices'
  handlers (local training, key agreement, masking: device work), and the same in wall time
  (which the machine's load inflates). What is left is the server's: building and checking every
  envelope, relaying, summing, reconstructing the secrets, removing the masks and averaging. In
  memory, devices run one after another, so device time never overlaps it;
- with SecAgg, also the unmasking alone (``unmask_seconds``: reconstruction and mask removal).

``--drop`` devices leave after sharing keys in every SecAgg round (their pairwise masks are then
removed by the server too). Results: ``results.json`` and ``results.md`` beside this file, with the
machine's load average before and after each configuration.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import write_json
from benchmarks.timing import command_line, git_state, load, machine, niceness

HERE = Path(__file__).resolve().parent


def build(devices: int, secagg: bool, drop: int, work: Path):
    from edgefl.algorithms.base import DeviceRecord
    from edgefl.config import resolve_config
    from edgefl.runtime.agent import DeviceAgent
    from edgefl.runtime.loop import LoopSettings, RoundLoop
    from edgefl.runtime.setup import assemble, build_server
    from edgefl.transport import InMemoryTransport

    explicit = {
        "algorithm": "fedavg",
        "dataset": "synthetic",
        "clients": devices,
        "rounds": 10,
        "train_samples": 20 * devices,
        "test_samples": 100,
        "eval_samples": 50,
        "steps": 1,
        "batch_size": 8,
        "min_size": 4,
        "width": 1.0,
        "out_dir": str(work),
        "run_name": "bench",
        "options": {"secagg": "on"} if secagg else {},
    }
    from edgefl.algorithms import get_algorithm

    cfg = resolve_config(explicit, dict(get_algorithm("fedavg").defaults))
    run = assemble(cfg)
    transport, samples = InMemoryTransport(), {}
    gone = set(run.ids[:drop]) if secagg else set()
    inside = {"cpu": 0.0}  # process CPU seconds spent inside the devices' handlers
    for d in run.ids:
        half = run.device_half(d)
        samples[d] = len(half.ctx.train_data)
        agent = DeviceAgent(half, algorithm=cfg.algorithm)

        def handler(env, agent=agent, d=d):
            if d in gone and env.payload.meta.get("secagg") == "mask":
                raise ConnectionError("left after sharing")
            t0 = time.process_time()
            try:
                return agent.handle(env)
            finally:
                inside["cpu"] += time.process_time() - t0

        transport.connect(d, handler)
    fleet = {d: DeviceRecord(spec=run.specs[d], num_samples=samples[d]) for d in run.ids}
    ctx = run.server_context(fleet)
    server = build_server(run.method, ctx)
    loop = RoundLoop(
        server, ctx, transport, LoopSettings(rounds=10, algorithm="fedavg", eval_every=0)
    )
    params = sum(
        int(v.size)
        for k, v in server.state_dict().items()
        if k.startswith("w/") and v.dtype.kind == "f"
    )
    return loop, params, inside


def measure(devices: int, secagg: bool, rounds: int, drop: int) -> dict:
    with tempfile.TemporaryDirectory() as work:
        load_before = load()
        loop, params, inside = build(devices, secagg, drop, Path(work))
        out = []
        for r in range(rounds):
            cpu0, device0 = time.process_time(), inside["cpu"]
            rec = loop.run_round(r)
            cpu = time.process_time() - cpu0
            device = sum(rec["reply_seconds"].values())
            out.append(
                {
                    "round": r + 1,
                    "completed": len(rec["completed"]),
                    "bytes_down": rec["bytes_down_total"],
                    "bytes_up": rec["bytes_up_total"],
                    "round_seconds": rec["round_seconds"],
                    "device_seconds": device,
                    "server_seconds": rec["round_seconds"] - device,
                    "server_cpu_seconds": cpu - (inside["cpu"] - device0),
                    **(
                        {
                            "unmask_seconds": rec["secagg"]["stage_seconds"]["unmask_server"],
                            "dropped": rec["secagg"]["dropped"],
                        }
                        if secagg
                        else {}
                    ),
                }
            )
        steady = out[1:] or out  # the first round warms caches up
        return {
            "devices": devices,
            "secagg": secagg,
            "dropped_per_round": drop if secagg else 0,
            "float_parameters": params,
            "rounds": out,
            "median_server_seconds": statistics.median(x["server_seconds"] for x in steady),
            "median_server_cpu_seconds": statistics.median(x["server_cpu_seconds"] for x in steady),
            "median_unmask_seconds": statistics.median(x["unmask_seconds"] for x in steady)
            if secagg
            else None,
            "bytes_up_per_device": statistics.median(x["bytes_up"] for x in steady) / devices,
            "bytes_down_per_device": statistics.median(x["bytes_down"] for x in steady) / devices,
            "load_before": load_before,
            "load_after": load(),
        }


def markdown(results: dict) -> str:
    lines = [
        "# Secure aggregation: bytes and server time (in memory)",
        "",
        f"Command: `{results['command']}` at commit {results['commit'][:12]}"
        f"{'' if results['clean'] else ' (tree not clean)'}. Machine: "
        f"{results['machine']['cores']} cores "
        f"({results['machine']['cpu']}), load average {results['load_start']} at the start and "
        f"{results['load_end']} "
        "at the end (a shared machine: the timings are under that load).",
        f"FedAvg, CNN tier 2 at width 1 ({results['cells'][0]['float_parameters']:,} float "
        "parameters), synthetic data, "
        "1 local step per round, every device selected; medians over rounds 2..R. SecAgg on the "
        "full graph, "
        "threshold 0.6, fixed point clip 8 in Z/2^32.",
        "",
        "| devices | SecAgg | dropped after sharing | up per device | down per device | server "
        "CPU s/round | server wall s/round | of which unmasking (wall) | load before → after |",
        "|---:|:---|---:|---:|---:|---:|---:|---:|:---|",
    ]
    for c in results["cells"]:
        unmask = (
            f"{c['median_unmask_seconds']:.3f}" if c["median_unmask_seconds"] is not None else "-"
        )
        lines.append(
            f"| {c['devices']} | {'yes' if c['secagg'] else 'no'} | {c['dropped_per_round']} | "
            f"{c['bytes_up_per_device'] / 1024:.1f} kB | {c['bytes_down_per_device'] / 1024:.1f} "
            "kB | "
            f"{c['median_server_cpu_seconds']:.3f} | {c['median_server_seconds']:.3f} | {unmask} | "
            f"{c['load_before']} → {c['load_after']} |"
        )
    lines.append("")
    for n in sorted({c["devices"] for c in results["cells"]}):
        plain = next(c for c in results["cells"] if c["devices"] == n and not c["secagg"])
        for c in (c for c in results["cells"] if c["devices"] == n and c["secagg"]):
            cpu = c["median_server_cpu_seconds"] / plain["median_server_cpu_seconds"]
            up = c["bytes_up_per_device"] / plain["bytes_up_per_device"] - 1
            down = c["bytes_down_per_device"] / plain["bytes_down_per_device"] - 1
            lines.append(
                f"- {n} devices, {c['dropped_per_round']} dropped: SecAgg's server CPU time is "
                f"{cpu:.1f}x the plain round's; bytes per device {100 * up:+.1f} % up, "
                f"{100 * down:+.1f} % down"
                + (
                    " (averaged over the round's devices: the dropped one sends no masked input)."
                    if c["dropped_per_round"]
                    else "."
                )
            )
    lines += [
        "",
        "Server CPU seconds = this process's CPU time in the round − its CPU time inside the "
        "devices' handlers",
        "(training, key agreement, masking); server wall seconds = the round's wall time − the "
        "handlers' wall time",
        "(inflated by the machine's load: compare the CPU column). Both count building and "
        "checking every envelope,",
        "relaying the sealed shares, reconstructing secrets, removing masks and averaging.",
        "With SecAgg a device's uplink is its masked update (4 bytes per parameter, as float32) "
        "plus its keys and",
        "n−1 sealed shares (160 bytes each) and its shares at unmasking (66 bytes per survivor "
        "and per dropped device);",
        "its downlink adds the roster (160 bytes per device) and the sealed shares addressed to "
        "it.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument(
        "--drop", type=int, default=1, help="devices that leave after sharing, per SecAgg round"
    )
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite results.md from results.json"
    )
    args = parser.parse_args(argv)
    if args.report_only:
        (HERE / "results.md").write_text(markdown(json.loads((HERE / "results.json").read_text())))
        return
    import torch

    torch.set_num_threads(1)
    results = {
        "command": command_line("benchmarks.secagg.run", argv),
        "niceness": niceness(),
        **git_state(),
        "machine": machine(),
        "torch_threads": 1,
        "load_start": load(),
        "cells": [],
    }
    for n in args.devices:
        for secagg, drop in ((False, 0), (True, 0), (True, args.drop)):
            t0 = time.perf_counter()
            cell = measure(n, secagg, args.rounds, drop)
            results["cells"].append(cell)
            print(
                f"{n} devices, secagg={secagg}, drop={cell['dropped_per_round']}: server "
                f"{cell['median_server_seconds']:.3f} s/round, "
                f"up {cell['bytes_up_per_device'] / 1024:.1f} kB/device "
                f"({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
    results["load_end"] = load()
    write_json(HERE / "results.json", results)
    (HERE / "results.md").write_text(markdown(results))


if __name__ == "__main__":
    main()
