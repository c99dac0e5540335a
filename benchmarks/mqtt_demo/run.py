"""The MQTT demo as a benchmark: embedded broker + server + N device processes vs the same run in memory.

    nice -n 10 .venv/bin/python -m benchmarks.mqtt_demo.run --algorithm fedavg --clients 6 --rounds 3 \
        --train-samples 6000 --width 0.25

Writes results.json and results.md here: wall time of each transport measured side by side in
one invocation (with the machine's load), their ratio, accuracies (which must agree: same seed,
same shards), and bytes per round. This is also the command behind `make demo`'s MQTT part.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import machine, write_json

HERE = Path(__file__).parent


def run(transport: str, args: argparse.Namespace, out: Path) -> dict:
    cmd = [
        sys.executable, "-m", "edgefl.cli.main", "simulate", "--transport", transport,
        "--algorithm", args.algorithm, "--dataset", args.dataset, "--clients", str(args.clients),
        "--rounds", str(args.rounds), "--partition", "dirichlet", "--alpha", "0.5", "--seed", "0",
        "--train-samples", str(args.train_samples), "--width", str(args.width), "--steps", str(args.steps),
        "--out", str(out), "--run-name", f"{args.algorithm}-{transport}", "--json", "--quiet",
    ]
    if args.tiers:
        cmd += ["--tiers", args.tiers]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    return {"transport": transport, "command": " ".join(cmd[3:]), "process_wall_seconds": time.perf_counter() - t0, **summary}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--algorithm", default="fedavg")
    p.add_argument("--dataset", default="fashion-mnist")
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--train-samples", type=int, default=6000)
    p.add_argument("--width", type=float, default=0.25)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--tiers", default=None)
    p.add_argument("--out", default=str(HERE / "runs"))
    p.add_argument("--results", default=str(HERE))
    args = p.parse_args()
    before = machine()
    results = [run(t, args, Path(args.out)) for t in ("memory", "mqtt")]
    mem, mq = results
    record = {
        "machine_before": before,
        "machine_after": machine(),
        "settings": vars(args),
        "runs": results,
        "mqtt_over_memory_wall_ratio": mq["process_wall_seconds"] / mem["process_wall_seconds"],
        "accuracy_equal": abs(mq["mean_accuracy"] - mem["mean_accuracy"]) < 1e-9,
    }
    out = Path(args.results)
    write_json(out / "results.json", record)
    lines = [
        "# MQTT demo vs in-memory simulation (same run, same seed)",
        "",
        f"Machine: {before['cores']} cores, load before {before['loadavg_1_5_15']}, after {record['machine_after']['loadavg_1_5_15']} ({before['date']}).",
        "",
        "| transport | wall s (process) | mean accuracy | bytes up / round | bytes down / round |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        up = sum(r["bytes_up_per_round"]) / len(r["bytes_up_per_round"])
        down = sum(r["bytes_down_per_round"]) / len(r["bytes_down_per_round"])
        lines.append(f"| {r['transport']} | {r['process_wall_seconds']:.1f} | {100 * r['mean_accuracy']:.2f}% | {up:,.0f} | {down:,.0f} |")
    lines += [
        "",
        f"MQTT / memory wall-time ratio: {record['mqtt_over_memory_wall_ratio']:.2f} (includes starting one Python process per device).",
        f"Accuracies equal: {record['accuracy_equal']}.",
        "",
        "Commands (run from the repo root):",
        "",
        *[f"    edgefl {r['command']}" for r in results],
        "",
    ]
    (out / "results.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
