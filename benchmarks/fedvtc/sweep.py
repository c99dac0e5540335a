"""FedVTC sensitivity sweep (issue #6): which ``tc_weight`` / ``vtc_lr`` let FedVTC learn at CPU size?

The paper adds L_tc to cross-entropy unscaled (tc_weight = 1) and trains 100 rounds × 5 epochs
at lr 1e-4 on MNIST. At the sizes a 2-core machine affords, the committed benchmark's default
(tc_weight = 0.01) left FedVTC near chance. This sweep runs FedVTC alone over a grid of
``tc_weight`` (and optionally ``vtc_lr``), on the same fleet, data and seed as ``run.py`` (it
reuses its configuration), and records for each variant:

- the accuracy after round R (before the synthetic fine-tuning) and after it;
- the mean over devices and rounds of what the devices report about local work: cross-entropy
  ``ce``, ``l_e`` (reconstruction + KL), ``l_rc`` (reconstruction alone) and ``l_dm``, so the
  balance between CE and L_tc is visible.

Usage:
    nice -n 10 .venv/bin/python benchmarks/fedvtc/sweep.py --rounds 12 --train-samples 12000 \\
        --tc-weights 1,0.1,0.01,0.001,0.0001 --alphas 1.0 --seeds 0
Results: ``sweep.json`` and ``sweep.md`` next to this file (``--out`` to change).
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
from benchmarks.fedvtc import run as bench  # noqa: E402

HERE = Path(__file__).parent
LOCAL_KEYS = ("ce", "l_e", "l_rc", "l_dm", "sigma_mean")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--fraction", type=float, default=0.25)
    ap.add_argument("--width", type=float, default=0.25)
    ap.add_argument("--train-samples", type=int, default=12000)
    ap.add_argument("--test-samples", type=int, default=1000)
    ap.add_argument("--eval-samples", type=int, default=500)
    ap.add_argument("--synthetic-samples", type=int, default=500)
    ap.add_argument("--finetune-epochs", type=int, default=5)
    ap.add_argument("--tc-weights", default="1,0.1,0.01,0.001,0.0001")
    ap.add_argument("--vtc-lrs", default="0.001", help="Adam lr of ψ and σ, comma-separated")
    ap.add_argument("--extra", default="", help="more options for every variant, k=v;k=v")
    ap.add_argument("--alphas", default="1.0")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--baselines", default="fedproto,local", help="run.py methods to run beside the sweep")
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--name", default="sweep", help="basename of the results files")
    return ap.parse_args(argv)


def local_work(run_dir: Path) -> dict[str, float]:
    """Mean over rounds and devices of the device metrics recorded in rounds.jsonl."""
    values: dict[str, list[float]] = {k: [] for k in LOCAL_KEYS}
    for line in (run_dir / "rounds.jsonl").read_text().splitlines():
        record = json.loads(line)
        for metrics in record.get("device_metrics", {}).values():
            for k in LOCAL_KEYS:
                if k in metrics:
                    values[k].append(metrics[k])
    return {k: mean(v) for k, v in values.items() if v}


def main(argv=None) -> None:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    extra = dict(kv.split("=", 1) for kv in args.extra.split(";") if kv)
    variants = [
        {"tc_weight": w, "vtc_lr": lr, **extra}
        for w in args.tc_weights.split(",") if w
        for lr in args.vtc_lrs.split(",") if lr
    ]
    command = "nice -n 10 .venv/bin/python benchmarks/fedvtc/sweep.py " + " ".join(argv if argv is not None else sys.argv[1:])
    meta = {"machine_before": machine(), "command": command.strip(), "args": {k: str(v) for k, v in vars(args).items()}}
    results_path = args.out / f"{args.name}.json"
    t0 = time.perf_counter()
    runs: list[dict] = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for alpha in (float(a) for a in args.alphas.split(",")):
            jobs = [("fedvtc", v, "-" + "-".join(f"{k}{v[k]}" for k in ("tc_weight", "vtc_lr"))) for v in variants]
            jobs += [(m, None, "") for m in args.baselines.split(",") if m]
            for method, options, tag in jobs:
                r = bench.one_run(args, method, alpha, seed, options, tag)
                run_dir = args.out / "runs" / f"{method}{tag}-a{alpha:g}-s{seed}"
                r["local_work"] = local_work(run_dir) if method == "fedvtc" else {}
                r.pop("client_accuracy", None)
                runs.append(r)
                print(f"{method}{tag} α={alpha:g} seed={seed} acc={100 * r['mean_accuracy']:.1f}% "
                      f"round-R={r['accuracy_after_round_R']} local={ {k: round(v, 3) for k, v in r['local_work'].items()} } "
                      f"wall={r['wall_seconds']:.0f}s", flush=True)
                meta.update(machine_after=machine(), wall_seconds=time.perf_counter() - t0)
                write_json(results_path, {"meta": meta, "runs": runs})
    write_markdown(args, runs, meta)


def write_markdown(args, runs: list[dict], meta: dict) -> None:
    lines = [
        f"# FedVTC sweep: {args.clients} devices (CNN tiers 1–5, width {args.width}), {args.train_samples} Fashion-MNIST "
        f"training images, {args.rounds} rounds at {args.fraction:.0%} participation, S = {args.synthetic_samples}, "
        f"𝒯 = {args.finetune_epochs}",
        "",
        f"Command: `{meta['command']}`",
        "",
        f"Machine: {meta['machine_before']['cores']} cores, load {meta['machine_before']['loadavg_1_5_15']} at the start, "
        f"{meta['machine_after']['loadavg_1_5_15']} at the end; {meta['wall_seconds'] / 60:.1f} min in all.",
        "",
        "Accuracy: mean over devices on the first test images (final: --test-samples; round R: --eval-samples). "
        "Local work: means over devices and rounds of what the devices reported.",
        "",
        "| α | seed | method | tc_weight | vtc_lr | final % | after round R % | CE | L_e | L_rc | L_dm | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        o, lw = r["options"], r["local_work"]
        before = "–" if r["accuracy_after_round_R"] is None else f"{100 * r['accuracy_after_round_R']:.1f}"
        cells = [f"{lw[k]:.3g}" if k in lw else "–" for k in ("ce", "l_e", "l_rc", "l_dm")]
        lines.append(
            f"| {r['alpha']:g} | {r['seed']} | {r['method']} | {o.get('tc_weight', '–')} | {o.get('vtc_lr', '–')} | "
            f"{100 * r['mean_accuracy']:.1f} | {before} | " + " | ".join(cells) + f" | {r['wall_seconds']:.0f} |"
        )
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
