"""The demo's training floor on this machine: ``python -m benchmarks.demo.floor [--rounds 2]``.

Runs the demo's devices and training budget (the options of ``make demo``) in memory, one device
at a time at one torch thread, and sums each round's per-device training seconds: the CPU time the
devices' training needs per round, with no other process sharing a core. On ``cores`` cores the
demo's 12 rounds of training take about 12 × the mean sum ÷ cores at best, before the server's
step, the start-up and the export. Writes ``floor.json`` and ``floor.md`` beside this file through
the timing harness (:mod:`benchmarks.timing`: the command as invoked, the load before and after).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.timing import Timing

HERE = Path(__file__).resolve().parent
DEMO_ROUNDS = 12
#: make demo's options that decide the devices and their training (the Makefile's demo target)
DEMO_OPTIONS = [
    "--algorithm",
    "velo",
    "--dataset",
    "fashion-mnist",
    "--clients",
    "20",
    "--partition",
    "dirichlet",
    "--alpha",
    "0.5",
    "--lr",
    "0.003",
    "--option",
    "cvae_interval=2",
    "--train-samples",
    "18000",
    "--epochs",
    "3",
    "--seed",
    "0",
]


def floor_run(rounds: int) -> dict:
    """One sample: the demo's devices trained ``rounds`` rounds, one at a time at one thread; its
    value is the floor of the demo's 12 rounds on this machine's cores, in seconds."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [str(Path(sys.executable).with_name("edgefl")), "simulate", *DEMO_OPTIONS,
               "--rounds", str(rounds), "--threads", "1", "--test-samples", "500",
               "--eval-every", str(rounds), "--eval-samples", "500", "--out", out,
               "--run-name", "floor"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        records = (Path(out) / "floor" / "rounds.jsonl").read_text().splitlines()
    per_round = [round(sum(json.loads(r)["train_seconds"].values()), 2) for r in records]
    mean = sum(per_round) / len(per_round)
    return {"value": DEMO_ROUNDS * mean / os.cpu_count(), "train_cpu_seconds_per_round": per_round,
            "command": "edgefl " + " ".join(cmd[1:-4])}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--repetitions", type=int, default=1)
    args = p.parse_args(argv)
    timing = Timing("The demo's training floor on this machine", HERE,
                    metric="training floor of the demo's 12 rounds", settings=vars(args))
    samples = timing.alternate("floor", {"demo devices": lambda: floor_run(args.rounds)},
                               args.repetitions)
    lines = ["", "## Per run", ""]
    for s in samples:
        if s.get("value") is not None:
            seconds = ", ".join(f"{x:.1f}" for x in s["train_cpu_seconds_per_round"])
            lines.append(f"- `{s['command']}`: the 20 devices, one at a time at one thread, train "
                         f"**{seconds} CPU-seconds** in its rounds, so {DEMO_ROUNDS} rounds of "
                         f"training need about **{s['value']:.0f} s** of this machine's "
                         f"{os.cpu_count()} cores, before the server's step, the start-up and the "
                         "export.")
    results = timing.write(extra_md=lines, name="floor")
    print((HERE / "floor.md").read_text())
    return results


if __name__ == "__main__":
    main()
