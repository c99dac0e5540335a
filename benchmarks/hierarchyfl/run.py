"""HierarchyFL vs HeteroFL on real Fashion-MNIST (issue 4): the paper's Table I and II shapes.

20 devices, 5 per tier, every device every round; Dir(0.1), Dir(0.5) and IID; depth tiers
(multi-exit ResNet-18, exits 1-4) for two seeds, one width-tier run (1/8, 1/4, 1/2, 1) on
Dir(0.1); the ablation (averaging only = HeteroFL / + ensemble logits / + ensemble features =
HierarchyFL) on Dir(0.1). Every run goes through ``edgefl simulate`` as a user would.

CPU-sized (2 shared cores): width 0.125, few rounds of few local steps; see PROFILES. Runs are
resumable: a run whose summary exists is read back, not repeated.

Usage:
    nice -n 10 .venv/bin/python benchmarks/hierarchyfl/run.py            # the full benchmark
    nice -n 10 .venv/bin/python benchmarks/hierarchyfl/run.py --profile smoke --out /tmp/hfl
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from statistics import mean

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.common import machine, write_json  # noqa: E402

HERE = Path(__file__).parent
DEPTH_TIERS = ("1", "2", "3", "4")
WIDTH_TIERS = ("1/8", "1/4", "1/2", "1")
PARTITIONS = {
    "dir0.1": ["--partition", "dirichlet", "--alpha", "0.1"],
    "dir0.5": ["--partition", "dirichlet", "--alpha", "0.5"],
    "iid": ["--partition", "iid"],
}
PROFILES = {
    # the committed benchmark: about 40 minutes on 2 cores at load ~15
    "full": {"rounds": 8, "steps": 6, "width": 0.125, "seeds": (0, 1), "eval_every": 4,
             "eval_samples": 500, "test_samples": 1000, "train_samples": None},
    # checks the script end to end in a couple of minutes
    "smoke": {"rounds": 2, "steps": 1, "width": 0.125, "seeds": (0,), "eval_every": 1,
              "eval_samples": 200, "test_samples": 300, "train_samples": 6000},
}  # fmt: skip


def plan(seeds) -> list[dict]:
    """Runs in the order they matter if the time runs out.

    ``c`` is HierarchyFL's distillation steps per round: None = the spec's one pass over the
    public set (19 steps for 600 images); 1 = one step, which keeps server distillation small
    next to the few local steps of a CPU-sized run, as it is next to the paper's 5 local epochs.
    """

    def run(algo, part, seed, model="depth", ensemble=None, c=None):
        return {"algo": algo, "partition": part, "seed": seed, "model": model, "ensemble": ensemble, "c": c}

    runs = []
    for seed in seeds:
        runs += [run("hierarchyfl", "dir0.1", seed), run("heterofl", "dir0.1", seed)]
        runs += [run("hierarchyfl", "dir0.1", seed, c=1), run("hierarchyfl", "dir0.1", seed, ensemble="logits", c=1)]
        runs += [run("hierarchyfl", "iid", seed), run("heterofl", "iid", seed)]
        if seed == seeds[0]:
            runs += [run("hierarchyfl", "dir0.1", seed, "width"), run("heterofl", "dir0.1", seed, "width")]
        runs += [run("hierarchyfl", "dir0.5", seed), run("heterofl", "dir0.5", seed)]
    return runs


def run_name(r: dict) -> str:
    variant = f"-{r['ensemble']}" if r["ensemble"] else ""
    variant += f"-c{r['c']}" if r.get("c") else ""
    return f"{r['algo']}{variant}-{r['model']}-{r['partition']}-s{r['seed']}"


def simulate(r: dict, p: dict, runs_dir: Path, config: Path) -> dict:
    tiers = DEPTH_TIERS if r["model"] == "depth" else WIDTH_TIERS
    args = [
        "--algorithm", r["algo"], "--dataset", "fashion-mnist", "--model", f"hierarchy-{r['model']}",
        "--tiers", ",".join(tiers), "--clients", "20", *PARTITIONS[r["partition"]],
        "--rounds", str(p["rounds"]), "--steps", str(p["steps"]), "--width", str(p["width"]),
        "--seed", str(r["seed"]), "--eval-every", str(p["eval_every"]), "--test-samples", str(p["test_samples"]),
        "--config", str(config), "--out", str(runs_dir), "--run-name", run_name(r),
    ]  # fmt: skip
    if p["train_samples"]:
        args += ["--train-samples", str(p["train_samples"])]
    if r["ensemble"]:
        args += ["-o", f"ensemble={r['ensemble']}"]
    if r.get("c"):
        args += ["-o", f"distill_steps={r['c']}"]
    # In-process through the CLI itself (Typer's runner): on a busy 2-core machine a fresh
    # interpreter spends ~25 s importing torch before the first round.
    from typer.testing import CliRunner

    from edgefl.cli.main import app

    load = machine()["loadavg_1_5_15"]
    t0 = time.perf_counter()
    out = CliRunner().invoke(app, ["simulate", *args, "--json", "--quiet"], catch_exceptions=False)
    if out.exit_code != 0:
        raise RuntimeError(f"{run_name(r)} failed: {out.output[-2000:]}")
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    summary.update(
        command="edgefl simulate " + " ".join(args),
        process_seconds=time.perf_counter() - t0,
        loadavg_before=load,
        loadavg_after=machine()["loadavg_1_5_15"],
    )
    return summary


def curves(run_dir: Path) -> dict:
    """Per-round test accuracy per tier, and the server's seconds per round."""
    rounds = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
    return {
        "eval_rounds": [r["round"] + 1 for r in rounds if "eval" in r],
        "round_tier_accuracy": [r["eval"]["tier_accuracy"] for r in rounds if "eval" in r],
        "aggregate_seconds": [r["aggregate_seconds"] for r in rounds],
        "round_seconds": [r["round_seconds"] for r in rounds],
        "meta_weights": [
            {k.removeprefix("meta_weight_"): v for k, v in r["server"].items() if k.startswith("meta_weight_")}
            for r in rounds
        ],
    }


KEEP = ("tier_accuracy", "mean_accuracy", "wall_seconds", "process_seconds", "command", "loadavg_before",
        "loadavg_after", "bytes_up_per_round", "bytes_down_per_round", "failed_per_round")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", choices=sorted(PROFILES), default="full")
    ap.add_argument("--out", type=Path, default=HERE, help="where results and runs/ go")
    ap.add_argument("--max-minutes", type=float, default=45.0, help="start no new run after this")
    ap.add_argument("--report-only", action="store_true", help="rewrite results.md and the plot from results.json")
    args = ap.parse_args()
    if args.report_only:
        report(json.loads((args.out / "results.json").read_text()), args.out)
        return
    import torch

    torch.set_num_threads(1)  # tiny models: a second intra-op thread only adds sync on busy cores
    p = PROFILES[args.profile]
    out = args.out
    runs_dir = out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    config = out / "common.toml"
    config.write_text(f"threads = 1\neval_samples = {p['eval_samples']}\n")
    results: dict = {"profile": args.profile, "settings": p, "machine_before": machine(), "runs": {}}
    t_start = time.perf_counter()
    for r in plan(p["seeds"]):
        name = run_name(r)
        done = runs_dir / name / "summary.json"
        if done.exists() and (runs_dir / name / "bench.json").exists():
            summary = json.loads((runs_dir / name / "bench.json").read_text())
        elif (time.perf_counter() - t_start) / 60 > args.max_minutes:
            print(f"skipped {name}: past --max-minutes", flush=True)
            continue
        else:
            summary = {k: v for k, v in simulate(r, p, runs_dir, config).items() if k in KEEP}
            write_json(runs_dir / name / "bench.json", summary)
        results["runs"][name] = {**r, **summary, **curves(runs_dir / name)}
        acc = " ".join(f"{t}:{100 * a:.1f}" for t, a in sorted(summary["tier_accuracy"].items()))
        print(f"{name}: {acc} ({summary['wall_seconds']:.0f} s)", flush=True)
        results["machine_after"] = machine()
        write_json(out / "results.json", results)
        report(results, out)
    results["benchmark_minutes"] = (time.perf_counter() - t_start) / 60
    write_json(out / "results.json", results)
    report(results, out)


# --- report ----------------------------------------------------------------------------------


def _runs(results, **match) -> list[dict]:
    return [r for r in results["runs"].values() if all(r.get(k) == v for k, v in match.items())]


def _cell(runs: list[dict], tier: str) -> str:
    accs = [100 * r["tier_accuracy"][tier] for r in runs if tier in r["tier_accuracy"]]
    if not accs:
        return "—"
    if len(accs) == 1:
        return f"{accs[0]:.2f}"
    return f"{mean(accs):.2f} ({min(accs):.1f}–{max(accs):.1f})"


def _mean_acc(runs: list[dict], tier: str) -> float | None:
    accs = [r["tier_accuracy"][tier] for r in runs if tier in r["tier_accuracy"]]
    return 100 * mean(accs) if accs else None


def report(results: dict, out: Path) -> None:
    p = results["settings"]
    m0 = results["machine_before"]
    lines = [
        "# HierarchyFL vs HeteroFL on Fashion-MNIST (issue 4)",
        "",
        f"Profile `{results['profile']}`: 20 devices (5 per tier, every device every round), "
        f"{p['rounds']} rounds × {p['steps']} local SGD steps (batch 32, lr 0.05, momentum 0.9, wd 5e-4), "
        f"ResNet-18 hierarchies at width {p['width']}, "
        f"{'all 60,000' if not p['train_samples'] else p['train_samples']} training images "
        "(1% carved out, stratified, as the server's labelled public set), "
        f"test accuracy on {p['test_samples']} test images. Seeds {list(p['seeds'])}; cells are the mean "
        "over seeds with (min–max). HierarchyFL: T = 3, β = 1, one distillation pass over the public set per round, "
        "meta-learner lr 0.05.",
        "",
        f"Machine: {m0['cores']} cores ({m0['cpu']}), load {m0['loadavg_1_5_15']} at start, "
        f"{results.get('machine_after', {}).get('loadavg_1_5_15')} at the end"
        + (f"; whole benchmark {results['benchmark_minutes']:.1f} min." if "benchmark_minutes" in results else "."),
        "",
        "## Table I shape: test accuracy (%) per depth tier (Model i = exit i)",
        "",
        "| Model | " + " | ".join(f"HeteroFL {k}" for k in PARTITIONS) + " | "
        + " | ".join(f"HierarchyFL {k}" for k in PARTITIONS) + " |",
        "|---|" + "---|" * (2 * len(PARTITIONS)),
    ]  # fmt: skip
    for tier in DEPTH_TIERS:
        row = [_cell(_runs(results, algo="heterofl", model="depth", partition=k), tier) for k in PARTITIONS]
        row += [
            _cell(_runs(results, algo="hierarchyfl", model="depth", partition=k, ensemble=None, c=None), tier)
            for k in PARTITIONS
        ]
        lines.append(f"| Model {tier} | " + " | ".join(row) + " |")
    lines += ["", "HierarchyFL − HeteroFL (points, mean over seeds):", "", "| Model | " + " | ".join(PARTITIONS) + " |",
              "|---|" + "---|" * len(PARTITIONS)]  # fmt: skip
    for tier in DEPTH_TIERS:
        row = []
        for k in PARTITIONS:
            a = _mean_acc(_runs(results, algo="hierarchyfl", model="depth", partition=k, ensemble=None, c=None), tier)
            b = _mean_acc(_runs(results, algo="heterofl", model="depth", partition=k), tier)
            row.append("—" if a is None or b is None else f"{a - b:+.2f}")
        lines.append(f"| Model {tier} | " + " | ".join(row) + " |")
    lines += [
        "",
        "## Table II shape: ablation of the ensemble library, depth tiers, Dir(0.1)",
        "",
        "| Averaging | Ensemble logits | Ensemble features | distillation steps / round | Model 4 (global) | Model 1 | mean of tiers |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, runs in (
        ("✓ |  |  | 0", _runs(results, algo="heterofl", model="depth", partition="dir0.1")),
        ("✓ | ✓ |  | 1", _runs(results, algo="hierarchyfl", model="depth", partition="dir0.1", ensemble="logits", c=1)),
        ("✓ | ✓ | ✓ | 1", _runs(results, algo="hierarchyfl", model="depth", partition="dir0.1", ensemble=None, c=1)),
        ("✓ | ✓ | ✓ | one pass (19)", _runs(results, algo="hierarchyfl", model="depth", partition="dir0.1", ensemble=None, c=None)),
    ):
        means = [100 * r["mean_accuracy"] for r in runs]
        avg = f"{mean(means):.2f}" if means else "—"
        lines.append(f"| {label} | {_cell(runs, '4')} | {_cell(runs, '1')} | {avg} |")
    lines += ["", "## Width tiers (1/8, 1/4, 1/2, 1 of the channels), Dir(0.1)", "",
              "| Method | " + " | ".join(WIDTH_TIERS) + " |", "|---|" + "---|" * len(WIDTH_TIERS)]  # fmt: skip
    for algo, label in (("heterofl", "HeteroFL"), ("hierarchyfl", "HierarchyFL")):
        runs = _runs(results, algo=algo, model="width", partition="dir0.1")
        lines.append(f"| {label} | " + " | ".join(_cell(runs, t) for t in WIDTH_TIERS) + " |")
    lines += ["", "## Cost (measured side by side in this benchmark)", "",
              "| pair | HierarchyFL wall s | HeteroFL wall s | ratio | server s/round HierarchyFL | HeteroFL |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for r in results["runs"].values():
        if r["algo"] != "hierarchyfl" or r["ensemble"] or r.get("c"):
            continue
        twin = results["runs"].get(run_name({**r, "algo": "heterofl"}))
        if twin:
            lines.append(
                f"| {r['model']} {r['partition']} s{r['seed']} | {r['wall_seconds']:.0f} | {twin['wall_seconds']:.0f} | "
                f"{r['wall_seconds'] / twin['wall_seconds']:.2f} | {mean(r['aggregate_seconds']):.2f} | "
                f"{mean(twin['aggregate_seconds']):.2f} |"
            )
    lines += ["", "Accuracy per round: `accuracy.png` (depth tiers, mean over seeds). Commands: `command` of each "
              "run in results.json; per-round records in runs/*/rounds.jsonl.", ""]  # fmt: skip
    (out / "results.md").write_text("\n".join(lines) + "\n")
    plot(results, out)


def plot(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PARTITIONS), figsize=(5 * len(PARTITIONS), 4), sharey=True)
    colors = dict(zip(DEPTH_TIERS, ("tab:red", "tab:orange", "tab:green", "tab:blue"), strict=True))
    for ax, part in zip(axes, PARTITIONS, strict=True):
        for algo, c, style in (("hierarchyfl", None, "-"), ("heterofl", None, "--"), ("hierarchyfl", 1, ":")):
            runs = _runs(results, algo=algo, model="depth", partition=part, ensemble=None, c=c)
            if not runs:
                continue
            # per-round quick evaluations, then the final test accuracy after the last round
            xs = runs[0]["eval_rounds"] + [results["settings"]["rounds"]]
            label = algo + (f" C={c}" if c else "")
            for tier in DEPTH_TIERS:
                ys = [
                    mean(100 * (r["round_tier_accuracy"] + [r["tier_accuracy"]])[i].get(tier, float("nan")) for r in runs)
                    for i in range(len(xs))
                ]
                ax.plot(xs, ys, style, color=colors[tier], marker="o", ms=3, label=f"{label} M{tier}")
        ax.set_title(part)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy (%)")
    if axes[-1].get_legend_handles_labels()[0]:
        axes[-1].legend(fontsize=7, ncol=2)
    fig.suptitle("HierarchyFL (solid; dotted: 1 distillation step/round) vs HeteroFL (dashed), depth tiers, Fashion-MNIST")
    fig.tight_layout()
    fig.savefig(out / "accuracy.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
