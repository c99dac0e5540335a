"""Every method trains on a CUDA GPU (``--train-device cuda``): the check for a machine with one.

    python -m benchmarks.cuda.check --out DIR [--work TMP] [--data-dir D] [--jobs N]

For each registered method, and for local DP (Felo) and DP-SGD (FedAvg, Opacus), one small
in-memory run on real Fashion-MNIST (4 devices, 3 rounds, 2,000 training images, each method's
default models at width ≤ 0.25) trains once on the CPU and once on the GPU from the same seed.
A case passes when both runs finish every round with finite accuracies, the GPU run really
allocated GPU memory for training (``torch.cuda.max_memory_allocated``), and its final mean
accuracy is within 10 points of the CPU run's (the same seed; float arithmetic differs between
the devices, so the numbers are close, not equal). The GPU run's saved models then export to ONNX
(parity-checked against PyTorch by ``edgefl export``) and run under ONNX Runtime.

Writes ``DIR/results.json`` and ``DIR/results.md``; the runs and ONNX files go under ``--work``.
Needs a CUDA build of torch that sees a GPU;
without one every GPU case fails with ``--train-device cuda``'s own error, which is the point.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

#: (case name, algorithm, extra settings); the DP cases name their mechanism.
EXTRA_CASES = (
    ("felo+dp-local", "felo", {"options": {"dp": "local", "dp_target_epsilon": "8"}}),
    ("fedavg+dp-sgd", "fedavg", {"options": {"dp": "sgd", "dp_target_epsilon": "8"}}),
)
TOLERANCE_POINTS = 10.0


def cases() -> list[tuple[str, str, dict]]:
    from edgefl.algorithms import algorithm_names

    every = [(m, m, {}) for m in algorithm_names()] + list(EXTRA_CASES)
    chosen = os.environ.get("EDGEFL_CUDA_CHECK_CASES")  # a comma-separated subset (a quick rerun)
    return [c for c in every if not chosen or c[0] in chosen.split(",")]


def run_one(
    case: str, algorithm: str, extra: dict, device: str, out: Path, data_dir: str | None
) -> dict:
    """One run in this process (so that the GPU's memory statistics are this run's)."""
    import torch

    from edgefl.algorithms import get_algorithm
    from edgefl.config import resolve_config
    from edgefl.runtime.simulation import simulate

    torch.set_num_threads(1)
    defaults = dict(get_algorithm(algorithm).defaults)
    explicit = {
        "algorithm": algorithm,
        "dataset": "fashion-mnist",
        "data_dir": data_dir,
        "clients": 4,
        "rounds": 3,
        "train_samples": 2000,
        "test_samples": 1000,
        "eval_samples": 500,
        "epochs": 1,
        "seed": 0,
        "train_device": device,
        "out_dir": str(out),
        "run_name": f"{case}-{device}",
        "width": min(float(defaults.get("width", 1.0)), 0.25),
        **extra,
    }
    cfg = resolve_config({k: v for k, v in explicit.items() if v is not None}, defaults)
    start = time.perf_counter()
    summary = simulate(cfg, plots=False)
    row = {
        "case": case,
        "device": device,
        "seconds": round(time.perf_counter() - start, 2),
        "mean_accuracy": summary.get("mean_accuracy"),
        "rounds_completed": summary.get("rounds_completed"),
        "rounds": cfg.rounds,
        "run_dir": summary.get("run_dir"),
    }
    if device != "cpu":
        row["gpu_peak_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 2)
        row["gpu"] = torch.cuda.get_device_name(0)
    return row


def child(case: str, device: str, work: Path, data_dir: str | None) -> dict:
    """``run_one`` in a fresh interpreter; a crash is a failed case with its last lines."""
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.cuda.check",
        "--one",
        case,
        "--device",
        device,
        "--out",
        str(work),
        "--work",
        str(work),
    ]
    cmd += ["--data-dir", data_dir] if data_dir else []
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-8:]
        return {"case": case, "device": device, "error": "\n".join(tail)}
    return json.loads(lines[-1])


def verdict(cpu: dict, gpu: dict) -> tuple[bool, str]:
    for row in (cpu, gpu):
        if "error" in row:
            return False, f"{row['device']} run failed: {row['error'].splitlines()[-1]}"
        acc = row.get("mean_accuracy")
        if acc is None or not math.isfinite(acc) or row["rounds_completed"] != row["rounds"]:
            return (
                False,
                f"{row['device']} run: accuracy {acc}, "
                f"{row['rounds_completed']}/{row['rounds']} rounds",
            )
    if not gpu.get("gpu_peak_mib"):
        return False, "the GPU run allocated no GPU memory"
    gap = 100 * abs(gpu["mean_accuracy"] - cpu["mean_accuracy"])
    if gap > TOLERANCE_POINTS:
        return False, f"GPU and CPU accuracies differ by {gap:.1f} points"
    return True, f"|GPU − CPU| = {gap:.2f} points"


def export_check(run_dir: str, work: Path, data_dir: str | None = None) -> dict:
    """``edgefl export --run`` (parity-checked) and ``edgefl infer`` on a GPU run's models (the
    test images from ``data_dir`` where given, as the runs read them)."""
    onnx = work / "onnx"
    steps = [
        [
            sys.executable,
            "-m",
            "edgefl.cli.main",
            "export",
            "--run",
            run_dir,
            "--all",
            "--out",
            str(onnx),
        ],
        [
            sys.executable,
            "-m",
            "edgefl.cli.main",
            "infer",
            str(onnx / "d00.onnx"),
            "--dataset",
            "fashion-mnist",
            "--split",
            "test",
            "--limit",
            "500",
            *(["--data-dir", data_dir] if data_dir else []),
        ],
    ]
    log = []
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        log.append(
            {
                "command": " ".join(cmd[3:]),  # after python -m edgefl.cli.main
                "rc": proc.returncode,
                "tail": (proc.stdout + proc.stderr).strip().splitlines()[-6:],
            }
        )
        if proc.returncode != 0:
            break
    return {"ok": all(s["rc"] == 0 for s in log), "steps": log}


def page(results: dict) -> str:
    lines = [
        "# Training on a CUDA GPU (`--train-device cuda`)",
        "",
        f"Run by `python -m benchmarks.cuda.check` on {results['machine']} "
        f"(torch {results['torch']}, {results['gpu']}), at commit `{results['commit']}`, "
        f"{results['passed']} of {len(results['cases'])} cases passed.",
        "",
        "Each case: the same small run (4 devices, 3 rounds, 2,000 Fashion-MNIST training images, "
        "each method's default models at width ≤ 0.25, seed 0) on the CPU and on the GPU. "
        "It passes when both finish every round with finite accuracies, the GPU run allocated "
        f"GPU memory, and the mean final accuracies are within {TOLERANCE_POINTS:g} points "
        "(float arithmetic differs "
        "between the devices: close, not equal).",
        "",
        "| case | CPU accuracy | GPU accuracy | CPU s | GPU s | GPU peak MiB | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in results["cases"]:
        cpu, gpu = c["cpu"], c["gpu"]

        def acc(r):
            return (
                f"{100 * r['mean_accuracy']:.2f} %" if r.get("mean_accuracy") is not None else "—"
            )

        lines.append(
            f"| {c['case']} | {acc(cpu)} | {acc(gpu)} "
            f"| {cpu.get('seconds', '—')} | {gpu.get('seconds', '—')} "
            f"| {gpu.get('gpu_peak_mib', '—')} | {'pass' if c['ok'] else 'FAIL'}: {c['why']} |"
        )
    e = results["export"]
    lines += [
        "",
        f"Export of the GPU-trained FedAvg run's models: {'pass' if e['ok'] else 'FAIL'}",
        "",
    ]
    for s in e["steps"]:
        lines += [f"    $ edgefl {s['command']}   (exit {s['rc']})"] + [
            f"    {t}" for t in s["tail"]
        ]
    lines += [
        "",
        "CPU and GPU seconds are wall times of runs that ran side by side (up to "
        f"{results['jobs']} at once, one torch thread each): not a speed comparison.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/edgefl-cuda-check"))
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        case, algorithm, extra = next(c for c in cases() if c[0] == args.one)
        row = run_one(case, algorithm, extra, args.device, args.work / "runs", args.data_dir)
        print(json.dumps(row))
        return 0
    import torch

    args.out.mkdir(parents=True, exist_ok=True)
    todo = [(c[0], d) for c in cases() for d in ("cpu", "cuda")]
    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda t: child(t[0], t[1], args.work, args.data_dir), todo))
    by = {(r["case"], r["device"]): r for r in rows}
    out_cases = []
    for case, *_ in cases():
        ok, why = verdict(by[(case, "cpu")], by[(case, "cuda")])
        out_cases.append(
            {
                "case": case,
                "ok": ok,
                "why": why,
                "cpu": by[(case, "cpu")],
                "gpu": by[(case, "cuda")],
            }
        )
    fedavg = by[("fedavg", "cuda")]
    export = (
        export_check(fedavg["run_dir"], args.work, args.data_dir)
        if fedavg.get("run_dir")
        else {"ok": False, "steps": []}
    )
    commit = os.environ.get("EDGEFL_COMMIT", "unknown")
    results = {
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs)",
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU",
        "commit": commit,
        "jobs": args.jobs,
        "cases": out_cases,
        "export": export,
        "passed": sum(c["ok"] for c in out_cases),
    }
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "results.md").write_text(page(results))
    print(page(results))
    return 0 if results["passed"] == len(out_cases) and export["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
