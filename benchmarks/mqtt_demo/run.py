"""The MQTT demo as a benchmark: embedded broker + server + N device processes vs the same run
in memory.

    nice -n 10 .venv/bin/python -m benchmarks.mqtt_demo.run --algorithm fedavg --clients 6 \
        --rounds 3 --train-samples 6000 --width 0.25

Writes results.json and results.md here through the timing harness (:mod:`benchmarks.timing`):
the wall time of each transport's process, the two alternating over ``--repetitions``, with the
load before and after every run and the command as invoked; their paired ratio, the accuracies
(which must agree: same seed, same shards) and the bytes per round.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from benchmarks.timing import Timing

HERE = Path(__file__).parent
TRANSPORTS = ("memory", "mqtt")


def simulate_command(transport: str, args: argparse.Namespace) -> list[str]:
    """The ``edgefl simulate`` arguments of one transport's run."""
    cmd = [
        "simulate", "--transport", transport, "--algorithm", args.algorithm,
        "--dataset", args.dataset, "--clients", str(args.clients), "--rounds", str(args.rounds),
        "--partition", "dirichlet", "--alpha", "0.5", "--seed", "0",
        "--train-samples", str(args.train_samples), "--width", str(args.width),
        "--steps", str(args.steps), "--out", str(args.out),
        "--run-name", f"{args.algorithm}-{transport}", "--json", "--quiet",
    ]
    return cmd + (["--tiers", args.tiers] if args.tiers else [])


def run(transport: str, args: argparse.Namespace) -> dict:
    """One run's sample: its process's wall time (the harness's own clock) and its summary."""
    cmd = simulate_command(transport, args)
    done = subprocess.run([sys.executable, "-m", "edgefl.cli.main", *cmd], check=True,
                          capture_output=True, text=True)
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    rounds = len(summary["bytes_up_per_round"])
    return {"mean_accuracy": summary["mean_accuracy"],
            "bytes_up_per_round": sum(summary["bytes_up_per_round"]) / rounds,
            "bytes_down_per_round": sum(summary["bytes_down_per_round"]) / rounds}


def transport_table(samples: list[dict]) -> list[str]:
    lines = ["", "## Per run", "",
             "| repetition | transport | wall s (process) | mean accuracy | bytes up / round | "
             "bytes down / round |", "|---|---|---|---|---|---|"]
    for s in samples:
        if s.get("value") is None:
            continue
        lines.append(f"| {s['repetition']} | {s['variant']} | {s['value']:.1f} | "
                     f"{100 * s['mean_accuracy']:.2f}% | {s['bytes_up_per_round']:,.0f} | "
                     f"{s['bytes_down_per_round']:,.0f} |")
    return lines


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algorithm", default="fedavg")
    p.add_argument("--dataset", default="fashion-mnist")
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--train-samples", type=int, default=6000)
    p.add_argument("--width", type=float, default=0.25)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--tiers", default=None)
    p.add_argument("--repetitions", type=int, default=1)
    p.add_argument("--out", default=str(HERE / "runs"))
    p.add_argument("--results", default=str(HERE))
    args = p.parse_args(argv)
    timing = Timing("MQTT demo vs in-memory simulation (same run, same seed)", Path(args.results),
                    metric="process wall time", settings=vars(args))
    samples = timing.alternate("transport", {t: lambda t=t: run(t, args) for t in TRANSPORTS},
                               args.repetitions, baseline="memory")
    accuracy = {s["variant"]: s["mean_accuracy"] for s in samples if s.get("value") is not None}
    timing.results["accuracy_equal"] = (
        len(accuracy) == 2 and abs(accuracy["mqtt"] - accuracy["memory"]) < 1e-9)
    commands = [f"    edgefl {' '.join(simulate_command(t, args))}" for t in TRANSPORTS]
    results = timing.write(extra_md=[
        *transport_table(samples), "",
        "The MQTT run's time includes starting one Python process per device.",
        f"Accuracies equal (last runs): {timing.results['accuracy_equal']}.", "",
        "The runs' commands (from the repo root):", "", *commands])
    print((Path(args.results) / "results.md").read_text())
    return results


if __name__ == "__main__":
    main()
