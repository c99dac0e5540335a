"""FedDW benchmark (issue 5): FedAvg vs FedProx vs FedDW vs FedProx+DW on real Fashion-MNIST.

Two settings from the paper, 10 devices:
- practical: Dirichlet(0.5), every device every round;
- pathological: Dirichlet(0.1), half the devices per round.

Every method runs the same model (CNN tier 2 with the FedDW head: fc 256 → fc 128 → bias-free
classifier), Adam 1e-3 re-created each round, the same partition and seed. The metric is the
accuracy of the final global model on the test split (all devices hold it at the end).

CPU-sized (2 shared cores): ``--train-samples`` subsamples the training set, width 0.25, a fixed
number of local steps instead of 5 epochs, fewer rounds than the paper's 50. The λ schedule is
the code's (0.1, ÷10 at rounds 9, 18, …) unless ``--lam-decay`` is given.

Usage (the committed results):
    nice -n 10 .venv/bin/python benchmarks/feddw/run.py
Quick check:
    .venv/bin/python benchmarks/feddw/run.py --rounds 2 --train-samples 1000 --seeds 0 --out /tmp/feddw
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch  # noqa: E402

from benchmarks.common import machine, write_json  # noqa: E402
from edgefl.algorithms import get_algorithm  # noqa: E402
from edgefl.config import resolve_config  # noqa: E402
from edgefl.runtime.simulation import simulate  # noqa: E402

HERE = Path(__file__).parent
SETTINGS = {
    "practical": {"partition": "dirichlet", "alpha": 0.5, "fraction": 1.0},
    "pathological": {"partition": "dirichlet", "alpha": 0.1, "fraction": 0.5},
}
METHODS = {
    "fedavg": ("fedavg", {}),
    "fedprox": ("fedprox", {"mu": "0.01"}),
    "feddw": ("feddw", {}),
    "fedprox-dw": ("fedprox-dw", {"mu": "0.01"}),
}


def run_one(method: str, setting: str, seed: int, args, runs: Path) -> dict:
    algorithm, options = METHODS[method]
    if method.endswith("dw") and args.lam_decay is not None:
        options = {**options, "lam_decay_rounds": args.lam_decay}
    explicit = {
        "algorithm": algorithm,
        "options": options,
        "dataset": "fashion-mnist",
        "clients": 10,
        **SETTINGS[setting],
        "model": "cnn",
        "tiers": ("2",),
        "head": "feddw",
        "width": args.width,
        "optimizer": "adam",
        "lr": 1e-3,
        "batch_size": args.batch_size,
        "steps": args.steps,
        "rounds": args.rounds,
        "train_samples": args.train_samples,
        "test_samples": args.test_samples,
        "eval_samples": args.eval_samples,
        "eval_every": args.eval_every,
        "seed": seed,
        "threads": 1,
        "out_dir": str(runs),
        "run_name": f"{setting}-{method}-s{seed}",
    }
    cfg = resolve_config(explicit, dict(get_algorithm(algorithm).defaults))
    t0 = time.perf_counter()
    summary = simulate(cfg)
    return {
        "method": method,
        "setting": setting,
        "seed": seed,
        "accuracy": summary["mean_accuracy"],
        "accuracy_per_round": summary["accuracy_per_round"],
        "bytes_up_total": sum(summary["bytes_up_per_round"]),
        "wall_seconds": time.perf_counter() - t0,
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in explicit.items() if k not in ("out_dir",)},
    }


def table(results: list[dict], methods: list[str]) -> list[str]:
    lines = ["| setting | " + " | ".join(methods) + " |", "|---" * (len(methods) + 1) + "|"]
    for setting in SETTINGS:
        cells = []
        for m in methods:
            accs = [100 * r["accuracy"] for r in results if r["method"] == m and r["setting"] == setting]
            if not accs:
                cells.append("—")
                continue
            sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
            cells.append(f"{statistics.mean(accs):.2f} ± {sd:.2f}")
        lines.append(f"| {setting} | " + " | ".join(cells) + " |")
    return lines


def plot(results: list[dict], methods: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(SETTINGS), figsize=(10, 4), sharey=True)
    for ax, setting in zip(axes, SETTINGS, strict=True):
        for m in methods:
            runs = [r for r in results if r["method"] == m and r["setting"] == setting]
            if not runs or not runs[0]["accuracy_per_round"]:
                continue
            xs = [p["round"] for p in runs[0]["accuracy_per_round"]]
            ys = [100 * statistics.mean(r["accuracy_per_round"][i]["mean_accuracy"] for r in runs) for i in range(len(xs))]
            ax.plot(xs, ys, marker="o", ms=3, label=m)
        ax.set_title(setting)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy (%), mean over seeds")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--width", type=float, default=0.25)
    p.add_argument("--train-samples", type=int, default=6000)
    p.add_argument("--test-samples", type=int, default=2000)
    p.add_argument("--eval-samples", type=int, default=1000)
    p.add_argument("--eval-every", type=int, default=2)
    p.add_argument("--seeds", type=str, default="0,1")
    p.add_argument("--methods", type=str, default=",".join(METHODS))
    p.add_argument("--lam-decay", type=str, default=None, help="FedDW lam_decay_rounds (default: the code's 9,18,…)")
    p.add_argument("--out", type=Path, default=HERE)
    p.add_argument("--report-only", action="store_true", help="rewrite results.md from results.json (e.g. of an interrupted run)")
    args = p.parse_args()
    torch.set_num_threads(1)
    methods = [m for m in args.methods.split(",") if m]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    out = args.out
    runs = out / "runs"
    if args.report_only:
        import json

        results = json.loads((out / "results.json").read_text())
        methods = [m for m in METHODS if any(r["method"] == m for r in results["runs"])]
        seeds = sorted({r["seed"] for r in results["runs"]})
        results.setdefault("machine_after", machine())
    else:
        results = {"machine_before": machine(), "command": "nice -n 10 .venv/bin/python benchmarks/feddw/run.py " + " ".join(sys.argv[1:]), "runs": []}
        for seed in seeds:
            for setting in SETTINGS:
                for m in methods:
                    r = run_one(m, setting, seed, args, runs)
                    results["runs"].append(r)
                    print(f"{setting:12s} {m:11s} seed {seed}: {100 * r['accuracy']:.2f}%  ({r['wall_seconds']:.0f} s)", flush=True)
                    write_json(out / "results.json", results)  # partial results survive an interruption
        results["machine_after"] = machine()
    write_json(out / "results.json", results)
    rs = results["runs"]
    plot(rs, methods, out / "accuracy.png")

    def mean_of(m, s):
        accs = [r["accuracy"] for r in rs if r["method"] == m and r["setting"] == s]
        return statistics.mean(accs) if accs else float("nan")

    a = results["runs"][0]["config"]
    lines = [
        "# FedDW benchmark (real Fashion-MNIST, 10 devices)",
        "",
        f"Command: `{results['command']}`",
        "",
        f"Model: CNN tier 2 with the FedDW head, width {a['width']}; Adam lr 1e-3 (re-created each round), batch {a['batch_size']}, "
        f"{a['steps']} local steps per round, {a['rounds']} rounds; training set subsampled to {a['train_samples']} "
        f"(≈{a['train_samples'] // 10} per device); final accuracy of the global model on {a['test_samples']} test images; "
        f"seeds {', '.join(map(str, seeds))}. FedProx μ = 0.01; FedDW λ = 0.1 with the code's schedule.",
        "",
        f"Machine: {results['machine_before']['cores']} cores, load {results['machine_before']['loadavg_1_5_15']} before, "
        f"{results['machine_after']['loadavg_1_5_15']} after (shared with other jobs; wall times in results.json are not comparable across runs).",
        "",
        "Final test accuracy (%), mean ± sd over seeds:",
        "",
        *table(rs, methods),
        "",
        "![accuracy per round](accuracy.png)",
        "",
    ]
    if "feddw" in methods and "fedavg" in methods:
        gains = {s: 100 * (mean_of("feddw", s) - mean_of("fedavg", s)) for s in SETTINGS}
        above = all(g > 0 for g in gains.values())
        most = gains["pathological"] > gains["practical"]
        lines += [
            "## Does the paper's claim hold here?",
            "",
            "Claim: FedDW above FedAvg, with the largest gain under pathological non-IID.",
            "",
            f"- FedDW − FedAvg: practical {gains['practical']:+.2f} points, pathological {gains['pathological']:+.2f} points.",
            f"- FedDW above FedAvg in both settings: **{'yes' if above else 'no'}**; larger gain under pathological: **{'yes' if most else 'no'}**.",
        ]
        if "fedprox-dw" in methods and "fedprox" in methods:
            g = {s: 100 * (mean_of("fedprox-dw", s) - mean_of("fedprox", s)) for s in SETTINGS}
            lines.append(f"- FedProx+DW − FedProx: practical {g['practical']:+.2f}, pathological {g['pathological']:+.2f} points.")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
