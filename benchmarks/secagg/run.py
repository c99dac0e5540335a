"""Secure aggregation's cost: bytes, server time and device time of a FedAvg round without
SecAgg, with SecAgg on the full graph and with SecAgg+ on a k-regular neighbour graph, each also
with one device leaving after sharing keys, at 10 and 100 devices, in memory (the same round loop,
server half and device agents as a run), from one alternating run (benchmarks/timing.py).

    nice -n 10 .venv/bin/python -m benchmarks.secagg.run                  # 10 and 100 devices
    nice -n 10 .venv/bin/python -m benchmarks.secagg.run --devices 10 --repetitions 2
    .venv/bin/python -m benchmarks.secagg.run --report-only               # rewrite results.md

Per group (a number of devices) every variant's round loop is built first and runs one round
unrecorded (warm caches); then the variants alternate, one round a sample, in rotated order per
repetition, with the machine's load before and after each sample. FedAvg on the synthetic dataset
(one local step per round: the training is not what is measured) with the CNN of tier 2 at width
1, every device selected. The graph: ``secagg_neighbours=auto`` (k = 24 at 100 devices), and at
10 devices, where auto keeps the full graph, k = 4. Per sample:

- **server CPU seconds** (the metric): this process's CPU time in the round minus its CPU time
  inside the devices' handlers: building and checking every envelope, relaying, summing,
  reconstructing the secrets, removing the masks and averaging. In memory the devices run one
  after another, so device time never overlaps it; the same in wall time beside it;
- **device CPU seconds**: the CPU time inside the handlers over the round, per device (local
  training, key agreement, sealing and opening shares, masking, and the device's envelopes);
- **bytes** per device, down and up, over all the protocol's stages (exact wire sizes);
- with SecAgg, the unmasking alone (reconstruction and mask removal, wall).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.timing import Timing

HERE = Path(__file__).resolve().parent
ROUNDS = 100  # the loops' round budget: more than the samples a variant takes


def build(devices: int, options: dict, drop: int, work: Path):
    from edgefl.algorithms import get_algorithm
    from edgefl.algorithms.base import DeviceRecord
    from edgefl.config import resolve_config
    from edgefl.runtime.agent import DeviceAgent
    from edgefl.runtime.exchange import LoopSettings
    from edgefl.runtime.loop import RoundLoop
    from edgefl.runtime.setup import assemble, build_server
    from edgefl.transport import InMemoryTransport

    explicit = {
        "algorithm": "fedavg",
        "dataset": "synthetic",
        "clients": devices,
        "rounds": ROUNDS,
        "train_samples": 20 * devices,
        "test_samples": 100,
        "eval_samples": 50,
        "steps": 1,
        "batch_size": 8,
        "min_size": 4,
        "width": 1.0,
        "out_dir": str(work),
        "run_name": "bench",
        "options": options,
    }
    cfg = resolve_config(explicit, dict(get_algorithm("fedavg").defaults))
    run = assemble(cfg)
    transport, samples = InMemoryTransport(), {}
    gone = set(run.ids[:drop])
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
        server, ctx, transport, LoopSettings(rounds=ROUNDS, algorithm="fedavg", eval_every=0)
    )
    params = sum(
        int(v.size)
        for k, v in server.state_dict().items()
        if k.startswith("w/") and v.dtype.kind == "f"
    )
    return loop, params, inside


def variant(devices: int, options: dict, drop: int, work: Path):
    """A callable that runs the variant's next round and returns its sample."""
    loop, params, inside = build(devices, options, drop, work)
    state = {"round": 0}

    def one_round() -> dict:
        cpu0, device0 = time.process_time(), inside["cpu"]
        rec = loop.run_round(state["round"])
        state["round"] += 1
        cpu = time.process_time() - cpu0
        device_cpu = inside["cpu"] - device0
        device_wall = sum(rec["reply_seconds"].values())
        out = {
            "value": cpu - device_cpu,
            "server_wall_seconds": rec["round_seconds"] - device_wall,
            "device_cpu_seconds_per_device": device_cpu / devices,
            "completed": len(rec["completed"]),
            "bytes_up_per_device": rec["bytes_up_total"] / devices,
            "bytes_down_per_device": rec["bytes_down_total"] / devices,
            "float_parameters": params,
        }
        if "secagg" in rec:
            info = rec["secagg"]
            if "error" in info:
                raise RuntimeError(f"the SecAgg round failed: {info['error']}")
            out.update(
                unmask_seconds=info["stage_seconds"]["unmask_server"],
                neighbours=info["neighbours"],
                threshold=info["threshold"],
                dropped=info["dropped"],
            )
        return out

    one_round()  # warm-up, not recorded
    return one_round


def variants(devices: int, drop: int, small_k: int, work: Path) -> dict:
    from edgefl.privacy.secagg import SecAggSettings

    auto = SecAggSettings(on=True).neighbours_for(devices)
    k = auto if auto < devices - 1 else small_k
    full = {"secagg": "on", "secagg_neighbours": "full"}
    graph = {"secagg": "on", "secagg_neighbours": str(k)}
    return {
        "no SecAgg": variant(devices, {}, 0, work / "plain"),
        "full graph": variant(devices, full, 0, work / "full"),
        f"full graph, {drop} dropped": variant(devices, full, drop, work / "full-drop"),
        f"k = {k}": variant(devices, graph, 0, work / "graph"),
        f"k = {k}, {drop} dropped": variant(devices, graph, drop, work / "graph-drop"),
    }


def median_of(samples: list[dict], variant: str, key: str) -> float | None:
    values = [s[key] for s in samples if s["variant"] == variant and s.get(key) is not None]
    return statistics.median(values) if values else None


def table(results: dict) -> list[str]:
    """Bytes and device time per variant (the harness's tables hold the server's CPU time)."""
    lines = [
        "",
        "## Bytes, device time and server wall time (medians over the samples)",
        "",
        "| devices | variant | k | t | up per device | down per device | device CPU s/round "
        "| server CPU s/round | server wall s/round | unmasking (wall) s |",
        "|---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for group, g in results["groups"].items():
        samples = g["samples"]
        for name in g["variants"]:
            first = next((s for s in samples if s["variant"] == name and "value" in s), {})

            def cell(key, fmt, name=name, samples=samples):
                v = median_of(samples, name, key)
                return "-" if v is None else format(v, fmt)

            lines.append(
                f"| {group.split()[0]} | {name} | {first.get('neighbours', '-')} | "
                f"{first.get('threshold', '-')} | "
                f"{cell('bytes_up_per_device', ',.0f')} B | "
                f"{cell('bytes_down_per_device', ',.0f')} B | "
                f"{cell('device_cpu_seconds_per_device', '.4f')} | {cell('value', '.4f')} | "
                f"{cell('server_wall_seconds', '.3f')} | {cell('unmask_seconds', '.4f')} |"
            )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--repetitions", type=int, default=4)
    parser.add_argument("--drop", type=int, default=1, help="devices leaving after sharing")
    parser.add_argument(
        "--small-k", type=int, default=4, help="k where auto keeps the full graph (< 50 devices)"
    )
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite results.md from results.json"
    )
    args = parser.parse_args(argv)
    notes = [
        "Metric: server CPU seconds per round = this process's CPU time in the round minus its "
        "CPU time inside the devices' handlers (in memory the devices run one after another).",
        "FedAvg, CNN tier 2 at width 1, synthetic data, 1 local step per round, every device "
        "selected; SecAgg threshold 0.6 of the k + 1 holders of a device's shares, fixed point "
        "clip 8 in Z/2^32. 'dropped': devices leaving after sharing keys, every round.",
        "Device CPU s/round is per device: training (1 step), key agreement, sealing and opening "
        "shares, masking and its envelopes; the no-SecAgg row is the training and envelopes "
        "alone.",
    ]
    if args.report_only:
        timing = Timing.load_results(HERE / "results.json", unit="ms", scale=1000.0)
        timing.write(notes=notes, extra_md=table(timing.results))
        return
    import torch

    torch.set_num_threads(1)
    settings = {"repetitions": args.repetitions, "drop": args.drop, "small_k": args.small_k,
                "torch_threads": 1}  # fmt: skip
    timing = Timing(
        "Secure aggregation: full graph against a k-regular graph (SecAgg+), in memory",
        HERE,
        metric="server CPU seconds per round",
        unit="ms",
        scale=1000.0,
        settings=settings,
    )
    for n in args.devices:
        with tempfile.TemporaryDirectory() as work:
            t0 = time.perf_counter()
            group = variants(n, args.drop, args.small_k, Path(work))
            timing.alternate(
                f"{n} devices",
                group,
                args.repetitions,
                baseline="no SecAgg",
                on_sample=lambda s, n=n: print(
                    f"{n} devices, {s['variant']}: server {s.get('value')} s "
                    f"(load {s['load_after'][0]})",
                    flush=True,
                ),
            )
            print(f"{n} devices: {time.perf_counter() - t0:.0f} s", flush=True)
    timing.write(notes=notes, extra_md=table(timing.results))


if __name__ == "__main__":
    main()
