"""The demo's training floor on this machine: ``python -m benchmarks.demo.floor [--rounds 2]``.

Runs the demo's devices and training budget (the options of ``make demo``) in memory, one device
at a time at one torch thread, and sums each round's per-device training seconds: the CPU time the
devices' training needs per round, with no other process sharing a core. On ``cores`` cores the
demo's 12 rounds of training take about 12 × the mean sum ÷ cores at best, before the server's
step, the start-up and the export. Writes ``floor.json`` and ``floor.md`` beside this file, with the
command and the machine's load.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.runner import machine

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


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    before = machine()
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            str(Path(sys.executable).with_name("edgefl")),
            "simulate",
            *DEMO_OPTIONS,
            "--rounds",
            str(args.rounds),
            "--threads",
            "1",
            "--test-samples",
            "500",
            "--eval-every",
            str(args.rounds),
            "--eval-samples",
            "500",
            "--out",
            out,
            "--run-name",
            "floor",
        ]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        rounds = [
            json.loads(line)
            for line in (Path(out) / "floor" / "rounds.jsonl").read_text().splitlines()
        ]
    per_round = [round(sum(r["train_seconds"].values()), 2) for r in rounds]
    cores = before["cores"]
    mean = sum(per_round) / len(per_round)
    floor = DEMO_ROUNDS * mean / cores
    results = {"machine": before, "machine_after": machine()["loadavg_1_5_15"],
               "command": "edgefl " + " ".join(cmd[1:-4]), "train_cpu_seconds_per_round": per_round,
               "demo_rounds": DEMO_ROUNDS, "cores": cores, "floor_seconds": round(floor, 1)}
    (HERE / "floor.json").write_text(json.dumps(results, indent=2) + "\n")
    (HERE / "floor.md").write_text(
        "# The demo's training floor on this machine\n\n"
        f"`python -m benchmarks.demo.floor` ran `{results['command']}` on {cores} cores, "
        f"{before['date']}; load average "
        f"before {before['loadavg_1_5_15']}, after {results['machine_after']}. The 20 devices, "
        "one at a time at one "
        f"thread, train **{', '.join(f'{s:.1f}' for s in per_round)} CPU-seconds** in its rounds, "
        f"so {DEMO_ROUNDS} "
        f"rounds of training need about {DEMO_ROUNDS} × {mean:.1f} ÷ {cores} = **{floor:.0f} s** "
        "of "
        "this machine's cores, before the server's step, the start-up and the export.\n"
    )
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
