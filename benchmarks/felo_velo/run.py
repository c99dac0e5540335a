"""Felo / Velo on real Fashion-MNIST (issue #3): the paper's comparison, CPU-sized.

Blocks (each run is one ``edgefl.runtime.simulation.simulate`` call, the library path of
``edgefl simulate``):

- ``hetero``: 20 devices, ResNet10/14/18/22/26 (4 per depth, 7×7/2 stem of the authors' code),
  20 % sampled per round, Dir(0.5) and IID; methods local, fedhe, felo, velo; every seed.
- ``homo``: the homogeneous table analogue, ResNet18 everywhere: fedavg, felo, velo.
- ``samples``: Velo with the faithful CVAE data (``feature_upload=samples``) vs the default
  per-batch class means, Dir(0.5) and IID, first seed only.

Everything else follows the authors' code: Adam 1e-3, batch 50, 10 local steps per participation,
α = 0.5, CE-only warm-up for the first 5 % of rounds. What we shrink for a shared 2-core CPU:
width (channels ×0.125 → 64-d features), training set subsample, rounds, one intra-op thread.

Usage (the full benchmark; its exact command and settings are written into results.json):

    nice -n 10 .venv/bin/python benchmarks/felo_velo/run.py
    nice -n 10 .venv/bin/python benchmarks/felo_velo/run.py --tiny --out /tmp/fv   # smoke test

Runs already finished (their summary.json exists) are reused, so an interrupted benchmark resumes.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.common import machine, write_json  # noqa: E402

HERE = Path(__file__).parent
DEPTHS = ("10", "14", "18", "22", "26")
PARTITIONS = {"dir0.5": {"partition": "dirichlet", "alpha": 0.5}, "iid": {"partition": "iid"}}


def base_settings(args) -> dict:
    return {
        "dataset": "fashion-mnist",
        "clients": args.clients,
        "fraction": 0.2,
        "rounds": args.rounds,
        "train_samples": args.train_samples,
        "test_samples": args.test_samples,
        "eval_samples": args.eval_samples,
        "eval_every": args.eval_every,
        "model": "resnet",
        "model_options": {"stem": "imagenet"},
        "width": args.width,
        "optimizer": "adam",
        "lr": 1e-3,
        "batch_size": 50,
        "steps": 10,
        "threads": 1,
    }


def plan(args) -> list[dict]:
    """Most important first (an interrupted benchmark keeps the main comparison): the heterogeneous
    block for every seed, then the CVAE-data variant, then the homogeneous block."""
    runs = []
    if "hetero" in args.blocks:
        for seed in args.seeds:
            for part in PARTITIONS:
                for method in ("local", "fedhe", "felo", "velo"):
                    runs.append({"block": "hetero", "method": method, "algorithm": method, "partition": part, "seed": seed, "tiers": DEPTHS, "options": {}})
    if "samples" in args.blocks:
        for part in PARTITIONS:
            runs.append({"block": "samples", "method": "velo-samples", "algorithm": "velo", "partition": part, "seed": args.seeds[0], "tiers": DEPTHS, "options": {"feature_upload": "samples"}})
    if "homo" in args.blocks:
        for seed in args.homo_seeds or args.seeds:
            for part in PARTITIONS:
                for method in ("fedavg", "felo", "velo"):
                    runs.append({"block": "homo", "method": method, "algorithm": method, "partition": part, "seed": seed, "tiers": ("18",), "options": {}})
    return runs


def run_name(r: dict) -> str:
    return f"{r['block']}-{r['method']}-{r['partition']}-s{r['seed']}"


def execute(r: dict, args, runs_dir: Path) -> dict:
    from edgefl.algorithms import get_algorithm
    from edgefl.config import resolve_config
    from edgefl.runtime.simulation import simulate

    name = run_name(r)
    summary_path = runs_dir / name / "summary.json"
    if summary_path.exists():
        return json.loads(summary_path.read_text())
    explicit = {
        **base_settings(args),
        **PARTITIONS[r["partition"]],
        "algorithm": r["algorithm"],
        "tiers": r["tiers"],
        "seed": r["seed"],
        "options": r["options"],
        "out_dir": str(runs_dir),
        "run_name": name,
    }
    cfg = resolve_config(explicit, dict(get_algorithm(r["algorithm"]).defaults))
    t0 = time.perf_counter()
    summary = simulate(cfg)
    print(f"{name}: {100 * summary['mean_accuracy']:.2f}% in {time.perf_counter() - t0:.0f}s", flush=True)
    for png in (runs_dir / name).glob("*.png"):  # per-run plots stay out of the repository
        png.unlink()
    return summary


def weights_only_bytes(args, tiers) -> dict[str, int]:
    """What FedAvg of the same model sends per device and direction: an envelope of its weights."""
    import torch

    from edgefl.data import dataset_info
    from edgefl.models import ModelSpec, build_model
    from edgefl.wire import Envelope, Payload, encode, state_to_arrays

    info = dataset_info("fashion-mnist")
    out = {}
    for t in tiers:
        spec = ModelSpec("resnet", t, info.num_classes, info.in_shape, width=args.width, mean=info.mean, std=info.std, options={"stem": "imagenet"})
        with torch.random.fork_rng():
            model = build_model(spec)
        env = Envelope(kind="update", round=0, device_id="d00", algorithm="fedavg", tier=t, payload=Payload(state_to_arrays(model.state_dict()), {"num_samples": 1, "train_loss": 0.0}))
        out[t] = len(encode(env))
    return out


def traffic(run_dir: Path, weights: dict[str, int] | None = None) -> dict:
    """Mean bytes per participating device and round, up and down, and the server's aggregate time.

    With ``weights`` (tier → bytes of a weights-only envelope of that model), also the bytes beyond
    the weights, device by device: what the knowledge adds to FedAvg of the same models.
    """
    rounds = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
    fleet = json.loads((run_dir / "config.json").read_text())["fleet"]
    tier = {d: v["spec"]["tier"] for d, v in fleet.items()}
    up = [(d, b) for r in rounds for d, b in r["bytes_up"].items()]
    down = [(d, b) for r in rounds for d, b in r["bytes_down"].items()]
    out = {
        "bytes_up_per_device_round": statistics.mean(b for _, b in up),
        "bytes_down_per_device_round": statistics.mean(b for _, b in down),
        "aggregate_seconds_per_round": statistics.mean(r["aggregate_seconds"] for r in rounds),
        "round_seconds": statistics.mean(r["round_seconds"] for r in rounds),
        "train_seconds_per_device_round": statistics.mean(s for r in rounds for s in r["train_seconds"].values()),
    }
    if weights:
        out["fedavg_bytes_per_device_round"] = statistics.mean(weights[tier[d]] for d, _ in up)
        out["beyond_weights_up"] = statistics.mean(b - weights[tier[d]] for d, b in up)
        out["beyond_weights_down"] = statistics.mean(b - weights[tier[d]] for d, b in down)
    return out


def second_half_mean(summary: dict, rounds: int) -> float:
    pts = [p["mean_accuracy"] for p in summary["accuracy_per_round"] if p["round"] > rounds / 2]
    return statistics.mean(pts) if pts else float("nan")


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def fmt(values: list[float]) -> str:
    m, s = mean_std(values)
    return f"{100 * m:.2f} ± {100 * s:.2f}" if len(values) > 1 else f"{100 * m:.2f}"


def report(results: dict, args, out: Path) -> None:
    runs = results["runs"]
    lines = [
        "# Felo / Velo on Fashion-MNIST (issue #3)",
        "",
        f"Command: `{results['command']}`",
        "",
        f"Setting: {args.clients} devices, 20 % sampled per round, {args.rounds} rounds, ResNet (7×7/2 stem, width {args.width}, "
        f"{int(512 * args.width)}-d features), Adam 1e-3, batch 50, 10 steps per participation, α = 0.5, warm-up ⌈5 %⌉ of rounds; "
        f"training set subsampled to {args.train_samples}, final test on {args.test_samples} test images, "
        f"per-round evaluation on {args.eval_samples} every {args.eval_every} rounds; seeds {', '.join(map(str, args.seeds))} "
        f"(homogeneous block: {', '.join(map(str, args.homo_seeds or args.seeds))}; CVAE-data variant: {args.seeds[0]}). "
        "Accuracy = mean over all devices of each device's model on the test images (the paper's metric); "
        "'2nd half' = mean of the per-round evaluations after half of training.",
        "",
        f"Code: {results['code']}. Sum of the runs' wall time: {results['sum_of_run_wall_seconds'] / 60:.1f} min "
        "(one run at a time, one intra-op thread, under `nice -n 10`).",
        "",
        f"Machine at the start: {results['machine_before']}; at the end: {results.get('machine_after')}.",
        "",
    ]
    for block, title, methods in (
        ("hetero", "Heterogeneous ResNet10–26 (4 devices per depth)", ("local", "fedhe", "felo", "velo")),
        ("homo", "Homogeneous ResNet18 (the paper's Table 2 analogue; 20 % sampled, not 100 %)", ("fedavg", "felo", "velo")),
        ("samples", "Velo CVAE data: per-batch class means (default) vs sampled per-sample features (first seed)", ("velo", "velo-samples")),
    ):
        sel = [r for r in runs if r["block"] == block or (block == "samples" and r["block"] == "hetero" and r["method"] == "velo" and r["seed"] == args.seeds[0])]
        if not any(r["block"] == block for r in runs):
            continue
        lines += [f"## {title}", ""]
        depth_cols = DEPTHS if block != "homo" else ()
        header = "| partition | method | final acc % | 2nd half % | " + " | ".join(f"R{d}" for d in depth_cols) + (" |" if depth_cols else "") + " up B/dev/round | down B/dev/round |"
        lines += [header, "|" + "---|" * (header.count("|") - 1)]
        for part in PARTITIONS:
            for m in methods:
                rs = [r for r in sel if r["partition"] == part and r["method"] == m]
                if not rs:
                    continue
                cells = [part, m, fmt([r["final"] for r in rs]), fmt([r["second_half"] for r in rs])]
                cells += [fmt([r["tier_accuracy"][d] for r in rs]) for d in depth_cols]
                cells += [f"{statistics.mean(r['traffic']['bytes_up_per_device_round'] for r in rs):,.0f}", f"{statistics.mean(r['traffic']['bytes_down_per_device_round'] for r in rs):,.0f}"]
                lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Traffic: knowledge vs FedAvg of the same models", ""]
    lines += [results["traffic_note"], ""]
    for k, v in results["traffic_summary"].items():
        lines.append(f"- {k}: {v}")
    lines += ["", "## Server time (measured side by side in this benchmark)", ""]
    for k, v in results["server_time"].items():
        lines.append(f"- {k}: {v}")
    lines += ["", "## Ordering", "", results["ordering"], "", "![accuracy vs round](accuracy.png)", ""]
    (out / "results.md").write_text("\n".join(lines) + "\n")


def plot(results: dict, args, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, part in zip(axes, PARTITIONS, strict=True):
        for block, method, style in [("hetero", m, "-") for m in ("local", "fedhe", "felo", "velo")] + [("homo", m, "--") for m in ("fedavg", "felo", "velo")]:
            rs = [r for r in results["runs"] if r["block"] == block and r["method"] == method and r["partition"] == part]
            if not rs:
                continue
            xs = [p["round"] for p in rs[0]["accuracy_per_round"]]
            ys = [100 * statistics.mean(r["accuracy_per_round"][i]["mean_accuracy"] for r in rs) for i in range(len(xs))]
            ax.plot(xs, ys, style, marker="o", ms=3, label=f"{method} ({'R10–26' if block == 'hetero' else 'R18'})")
        ax.set_title(f"Fashion-MNIST {part} (mean over the seeds run)")
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"mean device accuracy (%) on {args.eval_samples} test images")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "accuracy.png", dpi=110)
    plt.close(fig)


def ordering(runs: list[dict], seeds) -> str:
    lines = []
    for part in PARTITIONS:
        acc = {}
        for m in ("local", "fedhe", "felo", "velo"):
            rs = [r["final"] for r in runs if r["block"] == "hetero" and r["method"] == m and r["partition"] == part]
            if rs:
                acc[m] = statistics.mean(rs)
        if len(acc) < 4:
            continue
        holds = acc["velo"] >= acc["felo"] > acc["fedhe"] > acc["local"]
        ranked = " > ".join(f"{m} {100 * a:.2f}" for m, a in sorted(acc.items(), key=lambda kv: -kv[1]))
        lines.append(f"- {part}: {ranked} (final accuracy, mean of seeds) — Velo ≥ Felo > FedHe > Local {'holds' if holds else 'does NOT hold'}.")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1])
    p.add_argument("--homo-seeds", type=lambda s: [int(x) for x in s.split(",")], default=None, help="seeds of the homogeneous block (default: --seeds)")
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--width", type=float, default=0.125)
    p.add_argument("--train-samples", type=int, default=12000)
    p.add_argument("--test-samples", type=int, default=5000)
    p.add_argument("--eval-samples", type=int, default=1000)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--code", default="the working tree", help="which edgefl code ran (recorded in the results)")
    p.add_argument("--blocks", default="hetero,homo,samples")
    p.add_argument("--out", type=Path, default=HERE)
    p.add_argument("--tiny", action="store_true", help="a 2-round smoke test of the whole script")
    args = p.parse_args()
    if args.tiny:
        args.rounds, args.seeds, args.clients, args.train_samples = 2, [0], 10, 1000
        args.test_samples, args.eval_samples, args.eval_every = 300, 200, 1
    args.blocks = args.blocks.split(",")
    out = args.out
    runs_dir = out / "runs"
    results = {
        "command": "nice -n 10 .venv/bin/python " + " ".join(shlex.quote(a) for a in sys.argv),
        "code": args.code,
        "settings": {**base_settings(args), "seeds": args.seeds, "homo_seeds": args.homo_seeds or args.seeds, "blocks": args.blocks, "tiers_hetero": DEPTHS, "tiers_homo": ["18"]},
        "machine_before": machine(),
        "runs": [],
    }
    previous = out / "results.json"
    if previous.exists():  # a resumed benchmark: the load at the real start is the one that matters
        results["machine_before"] = json.loads(previous.read_text()).get("machine_before", results["machine_before"])
    t0 = time.perf_counter()
    tiers_weights = weights_only_bytes(args, DEPTHS)
    for r in plan(args):
        summary = execute(r, args, runs_dir)
        results["runs"].append(
            {
                **{k: r[k] for k in ("block", "method", "partition", "seed", "options")},
                "final": summary["mean_accuracy"],
                "second_half": second_half_mean(summary, args.rounds),
                "tier_accuracy": summary["tier_accuracy"],
                "accuracy_per_round": summary["accuracy_per_round"],
                "wall_seconds": summary["wall_seconds"],
                "traffic": traffic(runs_dir / run_name(r), tiers_weights if r["algorithm"] in ("felo", "velo", "fedavg") else None),
            }
        )
        write_json(out / "results.json", results)  # partial results survive an interruption
    results["machine_after"] = machine()
    results["this_invocation_wall_seconds"] = time.perf_counter() - t0
    results["sum_of_run_wall_seconds"] = sum(r["wall_seconds"] for r in results["runs"])

    runs = results["runs"]
    by = lambda block, method, key: [r["traffic"][key] for r in runs if r["block"] == block and r["method"] == method]  # noqa: E731
    summary = {"weights-only (FedAvg) envelope per device and direction, bytes, by depth": tiers_weights}
    for m in ("fedhe", "felo", "velo", "velo-samples"):
        block = "samples" if m == "velo-samples" else "hetero"
        ups, downs = by(block, m, "bytes_up_per_device_round"), by(block, m, "bytes_down_per_device_round")
        if not ups:
            continue
        up, down = statistics.mean(ups), statistics.mean(downs)
        if m == "fedhe":  # nothing but knowledge travels
            summary[f"hetero {m}"] = f"up {up:,.0f} B, down {down:,.0f} B per device-round (logits only, no weights)"
            continue
        fedavg = statistics.mean(by(block, m, "fedavg_bytes_per_device_round"))
        ku, kd = statistics.mean(by(block, m, "beyond_weights_up")), statistics.mean(by(block, m, "beyond_weights_down"))
        summary[f"hetero {m}"] = (
            f"up {up:,.0f} B, down {down:,.0f} B per device-round; beyond the weights (same devices' FedAvg envelope "
            f"{fedavg:,.0f} B): up {ku:,.0f} B = {100 * ku / fedavg:.2f} %, down {kd:,.0f} B = {100 * kd / fedavg:.2f} %"
        )
    fa = by("homo", "fedavg", "bytes_up_per_device_round")
    for m in ("felo", "velo"):
        x = by("homo", m, "bytes_up_per_device_round")
        xd, fad = by("homo", m, "bytes_down_per_device_round"), by("homo", "fedavg", "bytes_down_per_device_round")
        if fa and x:
            summary[f"homo {m} vs fedavg (measured)"] = (
                f"up {statistics.mean(x):,.0f} vs {statistics.mean(fa):,.0f} B (+{100 * (statistics.mean(x) / statistics.mean(fa) - 1):.2f} %), "
                f"down {statistics.mean(xd):,.0f} vs {statistics.mean(fad):,.0f} B (+{100 * (statistics.mean(xd) / statistics.mean(fad) - 1):.2f} %)"
            )
    results["traffic_summary"] = summary
    results["traffic_note"] = (
        "Bytes are whole wire envelopes (safetensors, metadata included) per participating device and round, "
        "from rounds.jsonl. For heterogeneous Felo/Velo the knowledge share is the envelope minus a FedAvg "
        "envelope of the same model (weights only); Velo's uplink also carries the CVAE's feature points."
    )
    server_time = {}
    for block in ("hetero", "homo"):
        agg = {m: by(block, m, "aggregate_seconds_per_round") for m in ("fedhe", "felo", "velo", "fedavg")}
        if agg["felo"] and agg["velo"]:
            server_time[f"{block}: server aggregate s/round felo vs velo (CVAE)"] = (
                f"{statistics.mean(agg['felo']):.3f} vs {statistics.mean(agg['velo']):.3f} "
                f"(ratio {statistics.mean(agg['velo']) / max(statistics.mean(agg['felo']), 1e-9):.1f}×)"
            )
        tr = {m: by(block, m, "train_seconds_per_device_round") for m in ("local", "fedhe", "felo", "velo", "fedavg")}
        base = "local" if block == "hetero" else "fedavg"
        if tr[base]:
            server_time[f"{block}: device train s per participation, ratio to {base}"] = ", ".join(
                f"{m} {statistics.mean(v) / statistics.mean(tr[base]):.2f}×" for m, v in tr.items() if v
            )
    results["server_time"] = server_time
    results["ordering"] = ordering(runs, args.seeds)
    write_json(out / "results.json", results)
    plot(results, args, out)
    report(results, args, out)
    print((out / "results.md").read_text())


if __name__ == "__main__":
    main()
