"""DP-SGD on the device (``--dp sgd``): FedAvg's accuracy against the per-sample budget ε.

FedAvg, CNN tier 2 at width 0.25, on ten Fashion-MNIST devices at Dir(0.5), the profile of
``benchmarks.privacy`` (3,000 training images, about 300 a device; one local epoch a round,
every device every round, 16 rounds, lr ÷10 from round 11), SGD lr 0.05, momentum 0.9, batch 32;
and the same with 12,000 training images (about 1,200 a device: per-sample DP gains with the
samples a device holds). ε ∈ {1, 8} at δ = 1e-5 with DP-SGD (per-sample clip 1, noise
calibrated per device to spend ε over the 16 rounds) and ε = ∞ (no DP), three seeds each, two
runs at a time. Writes ``dp_sgd.json`` and ``dp_sgd.md`` beside this file, with the load::

    nice -n 10 python -m benchmarks.privacy.dp_sgd            # 9 runs
    nice -n 10 python -m benchmarks.privacy.dp_sgd --quick    # 3 rounds, one seed: a smoke test
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from benchmarks.common import machine, write_json
from benchmarks.privacy import profile
from benchmarks.timing import command_line

HERE = Path(__file__).resolve().parent
SEEDS = (0, 1, 2)
WORKERS = 2
EPSILONS = (None, 8.0, 1.0)  # None: no DP
CLIP = 1.0
DELTA = 1e-5
# the privacy benchmark's fleet (benchmarks.privacy.profile), FedAvg's CNN at width 0.25
PROFILE = {
    **profile(quick=False),
    "algorithm": "fedavg",
    "model": "cnn",
    "tiers": ("2",),
    "width": 0.25,
    "eval_every": 4,
    "threads": 1,
}
SIZES = (3000, 12000)  # training images of the whole fleet
QUICK = {"rounds": 3, "lr_decay_rounds": (2,)}


def run_cell(epsilon: float | None, seed: int, size: int, quick: bool, out: Path) -> dict:
    from edgefl.algorithms import get_algorithm
    from edgefl.config import resolve_config
    from edgefl.runtime.simulation import simulate

    explicit = {
        **PROFILE,
        **(QUICK if quick else {}),
        "seed": seed,
        "out_dir": str(out),
        "train_samples": size,
        "run_name": f"eps{epsilon}-s{seed}-n{size}",
    }
    if epsilon is not None:
        explicit["options"] = {
            "dp": "sgd",
            "dp_target_epsilon": str(epsilon),
            "dp_delta": str(DELTA),
            "dp_clip": str(CLIP),
        }
    cfg = resolve_config(explicit, dict(get_algorithm("fedavg").defaults))
    load = [round(x, 2) for x in os.getloadavg()]
    start, cpu = time.perf_counter(), time.process_time()
    summary = simulate(cfg, plots=False)
    cell = {
        "epsilon": epsilon,
        "seed": seed,
        "train_samples": size,
        "mean_accuracy": summary["mean_accuracy"],
        "accuracy_per_round": summary["accuracy_per_round"],
        "client_accuracy": summary["client_accuracy"],
        "wall_seconds": round(time.perf_counter() - start, 1),
        "cpu_seconds": round(time.process_time() - cpu, 1),
        "loadavg_1_5_15_at_start": load,
    }
    privacy = summary.get("privacy")
    if privacy:
        cell["epsilon_spent"] = privacy["epsilon"]
        cell["noise_multiplier"] = privacy["noise_multiplier"]
        cell["sample_rate"] = privacy["sample_rate"]
        cell["steps_per_round"] = privacy["steps_per_round"]
    return cell


def page(result: dict) -> str:
    cells = result["cells"]
    lines = [
        "# DP-SGD on the device: FedAvg's accuracy against the per-sample budget ε",
        "",
        "Written by `benchmarks/privacy/dp_sgd.py` (its docstring has the setting). Command:",
        "",
        f"    {result['command']}",
        "",
        f"Code {result['commit']}; machine {result['machine']['cores']} cores, load (1/5/15 min) "
        "at the start "
        f"{result['machine']['loadavg_1_5_15']}, at the end {result['loadavg_at_end']}; "
        f"{result['wall_minutes']} min in all "
        f"({result['cpu_minutes']} CPU min; two runs at a time)."
        + (
            ""
            if result["complete"]
            else f" **Interrupted**: {len(cells)} of the planned cells ran; the rest are missing."
        ),
        "",
        "| training images (a device: about) | ε (δ = 1e-5) | mean accuracy ± sd over seeds | per "
        "seed | "
        "noise multiplier z (min–max over devices) | ε spent (max over devices) |",
        "|---|---|---|---|---|---|",
    ]
    for size, epsilon in [(n, e) for n in SIZES for e in EPSILONS]:
        mine = [c for c in cells if c["epsilon"] == epsilon and c["train_samples"] == size]
        if not mine:
            continue
        accs = [c["mean_accuracy"] for c in mine]
        spread = f" ± {statistics.stdev(accs) * 100:.1f}" if len(accs) > 1 else ""
        per_seed = ", ".join(f"{a * 100:.1f}" for a in accs)
        if epsilon is None:
            z, spent, name = "—", "—", "∞ (no DP)"
        else:
            zs = [v for c in mine for v in c["noise_multiplier"].values()]
            z = f"{min(zs):.2f}–{max(zs):.2f}"
            spent = f"{max(v for c in mine for v in c['epsilon_spent'].values()):.3f}"
            name = f"{epsilon:g}"
        lines.append(
            f"| {size:,} ({size // 10:,}) | {name} | {statistics.mean(accs) * 100:.1f} %{spread} | "
            f"{per_seed} | {z} | {spent} |"
        )
    lines += [
        "",
        "Each device trains with Opacus's per-sample gradients: every step a Poisson sample of its",
        "shard (rate q = 1/⌈n/32⌉, n its images, so q·n ≤ 32 expected), each sample's gradient",
        f"clipped to L2 norm {CLIP:g}, Gaussian noise of standard deviation z·{CLIP:g} on the "
        "sum. z is",
        "calibrated per device (its q differs) so that the device spends ε over the 16 rounds",
        "(dp-accounting's PLD accountant, replace-one neighbours); ε is per sample of a device's "
        "data.",
        "Accuracy is the devices' mean on the test split at the end (the final global model).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="3 rounds, one seed (printed, not written)"
    )
    args = parser.parse_args(argv)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "edgefl"], capture_output=True, text=True, cwd=HERE
    ).stdout.strip()
    result = {
        "command": command_line("benchmarks.privacy.dp_sgd", argv),
        "commit": commit + ("+dirty" if dirty else ""),
        "machine": machine(),
        "profile": PROFILE,
        "clip": CLIP,
        "delta": DELTA,
        "cells": [],
    }
    start = time.perf_counter()
    todo = [
        (epsilon, seed, size)
        for size in (SIZES[:1] if args.quick else SIZES)
        for seed in (SEEDS[:1] if args.quick else SEEDS)
        for epsilon in EPSILONS
    ]
    with tempfile.TemporaryDirectory() as tmp, ProcessPoolExecutor(WORKERS) as pool:
        futures = [pool.submit(run_cell, *cell, args.quick, Path(tmp)) for cell in todo]
        for done, future in enumerate(futures, 1):
            cell = future.result()
            result["cells"].append(cell)
            print(
                f"ε={cell['epsilon']} seed {cell['seed']} n={cell['train_samples']}: "
                f"{cell['mean_accuracy'] * 100:.1f} % in "
                f"{cell['wall_seconds']} s ({cell['cpu_seconds']} s CPU)",
                file=sys.stderr,
            )
            # written after every cell (an interrupted run keeps what it measured, and says so)
            result["complete"] = done == len(todo)
            result["cpu_minutes"] = round(sum(c["cpu_seconds"] for c in result["cells"]) / 60, 1)
            result["wall_minutes"] = round((time.perf_counter() - start) / 60, 1)
            result["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
            if not args.quick:
                write_json(HERE / "dp_sgd.json", result)
                (HERE / "dp_sgd.md").write_text(page(result))
    print(page(result))


if __name__ == "__main__":
    main()
