"""Record a finished ``make demo`` run: ``python -m benchmarks.demo.record [--seconds S]``.

Writes ``benchmarks/demo/results.json`` and ``README.md`` from ``runs/demo`` (the summary with its
Local reference) with the wall time and the machine's load, so the numbers the README quotes come
from a run, not from a hand.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.common import device_class_counts
from benchmarks.runner import code_version, machine

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def group_labels(run: Path) -> dict[str, dict]:
    """Per depth tier: the class counts of the union of its devices' training data (the data the
    tier's averaged model learns from), rebuilt from the run's configuration (same seed, same
    partition), and how many of the 10 classes make up under 2 % of it."""
    import numpy as np

    groups: dict[str, np.ndarray] = {}
    for tier, counts in device_class_counts(json.loads((run / "config.json").read_text())).values():
        groups[tier] = groups.get(tier, 0) + np.asarray(counts)
    return {
        t: {"class_counts": c.tolist(), "rare_classes": int((c / c.sum() < 0.02).sum())}
        for t, c in groups.items()
    }


def around_rounds(run: Path, rounds: float, seconds: float) -> dict[str, float] | None:
    """The whole ``make demo`` before its first round and after its last, from the run's files:
    make's start (``started-at``, whole seconds), the last round's record (``rounds.jsonl``'s
    modification time) less the rounds' seconds; None without ``started-at``."""
    marker, records = run / "started-at", run / "rounds.jsonl"
    if not marker.exists() or not records.exists():
        return None
    last = records.stat().st_mtime - float(marker.read_text().split()[0])
    return {"before_rounds": round(last - rounds, 1), "after_rounds": round(seconds - last, 1)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--run", type=Path, default=ROOT / "runs" / "demo")
    p.add_argument(
        "--seconds", type=float, required=True, help="wall time of the whole `make demo`"
    )
    p.add_argument("--load-before", default="", help="load average before the run (1/5/15 min)")
    p.add_argument("--load-after", default="",
                   help="load average at the run's end (1/5/15 min; default: now)")
    p.add_argument(
        "--machine-note",
        default="",
        help="what is known of this machine's speed (a measured comparison)",
    )
    p.add_argument("--floor-ratio", type=float, default=None,
                   help="the wall time ÷ the training floor, measured beside it (ratio.py)")
    args = p.parse_args(argv)
    summary = json.loads((args.run / "summary.json").read_text())
    local = summary.get("local_reference") or {}
    results = {
        "command": "make demo",
        "code": code_version(),
        "wall_seconds": args.seconds,
        "wall_over_floor": args.floor_ratio,
        "machine_after": {**machine(), **({"loadavg_1_5_15": [float(x) for x in
                                                             args.load_after.split()]}
                                           if args.load_after else {})},
        "load_before": args.load_before,
        "machine_note": args.machine_note,
        "mean_accuracy": summary["mean_accuracy"],
        "local_mean_accuracy": local.get("mean_accuracy"),
        "gain_points": None
        if not local
        else 100 * (summary["mean_accuracy"] - local["mean_accuracy"]),
        "tier_accuracy": summary["tier_accuracy"],
        "local_tier_accuracy": local.get("tier_accuracy"),
        "rounds": summary["rounds"],
        "devices": len(summary["client_accuracy"]),
        "failed_per_round": summary["failed_per_round"],
        "bytes_up_per_round": summary["bytes_up_per_round"],
        "bytes_down_per_round": summary["bytes_down_per_round"],
        "group_labels": group_labels(args.run),
    }
    groups = results["group_labels"]
    felo_velo = json.loads((HERE.parent / "felo_velo" / "results.json").read_text())
    iid = f"{100 * felo_velo['bounds']['local_iid']:.1f} %"
    tiers = "\n".join(
        f"| {t} | {100 * a:.2f} | {100 * local['tier_accuracy'][t]:.2f} | "
        f"{100 * (a - local['tier_accuracy'][t]):+.2f} | "
        f"{groups[t]['rare_classes']} | {', '.join(map(str, groups[t]['class_counts']))} |"
        for t, a in summary["tier_accuracy"].items()
        if local and t in local["tier_accuracy"]
    )
    rounds = [
        json.loads(line)
        for line in (args.run / "rounds.jsonl").read_text().splitlines()
        if line.strip()
    ]
    collect = sum(r.get("collect_seconds", 0) for r in rounds)
    server = sum(r.get("aggregate_seconds", 0) for r in rounds)
    total = sum(r.get("round_seconds", 0) for r in rounds)
    results["round_seconds"] = {
        "rounds": round(total, 1),
        "devices_phase": round(collect, 1),
        "server_step": round(server, 1),
    }
    rounds_text = (
        f"{total:.0f} s in rounds, of which {collect:.0f} s waiting for the devices' replies "
        f"(their training) and {server:.0f} s in the server's step (the CVAE every second round)")
    ends = around_rounds(args.run, total, args.seconds)
    if ends is None:
        timing = (
            f"{rounds_text}; the rest of the {args.seconds:.0f} s is the start-up, the evaluation, "
            "the Local reference from the cache, the export with int8 and ONNX Runtime's "
            "evaluation")
    else:
        results["round_seconds"].update(ends)
        timing = (
            f"about {ends['before_rounds']:.0f} s before the first round (the command's start, "
            "the devices' fork server importing torch, the devices' start and registration), "
            f"{rounds_text}, and about {ends['after_rounds']:.0f} s after the last (the final "
            "evaluation, the record, the Local reference from the cache, the export with int8 "
            "and ONNX Runtime's evaluation, `edgefl infer`, the processes' ends)")
    m = results["machine_after"]
    cfg = json.loads((args.run / "config.json").read_text())
    decay = ", ".join(str(r + 1) for r in cfg.get("lr_decay_rounds") or ()) or "never"
    options = ", ".join(f"{k}={v}" for k, v in (cfg.get("options") or {}).items()) or "none"
    floor = "" if args.floor_ratio is None else (
        f"; **{args.floor_ratio:.2f}×** its training floor measured beside it ([ratio.md]"
        f"(ratio.md); target ≤ 1.2: **{'met' if args.floor_ratio <= 1.2 else 'not met'}**)")
    text = f"""# `make demo`: measured

Velo over MQTT (embedded broker, {results['devices']} device processes, ResNet10/14/18/22/26 at \
width {cfg['width']:g},
{results['devices'] // 5} devices per depth), real Fashion-MNIST ({cfg['train_samples']:,} \
training images), Dir({cfg['alpha']:g}),
{results['rounds']} rounds of {cfg['epochs']} local epochs with Adam at lr {cfg['lr']:g} (batch \
{cfg['batch_size']}), ×0.1 from
round {decay}, options {options} (the CVAE trained every second round): the budget chosen on a
validation split over four seeds ([tune/](tune/results.md));
then ONNX export with int8 and ONNX Runtime evaluation. Written by `python -m \
benchmarks.demo.record`
from `runs/demo`.

- mean device accuracy on 2,000 test images: **{100 * results['mean_accuracy']:.2f} %**
- Local (the same devices without federation): \
{100 * (results['local_mean_accuracy'] or float('nan')):.2f} %
  → the federation adds **{results['gain_points']:+.2f} points**
- whole `make demo` (training, Local reference from the cache, export, int8, ONNX Runtime):
  **{args.seconds:.0f} s** on {m['cores']} cores; load average before {args.load_before or '?'}, \
after {m['loadavg_1_5_15']}{floor}
- failed devices per round: {results['failed_per_round']}
- code: `{results['code']}`
- issue 14's targets: whole demo within 4 minutes: \
**{'met' if args.seconds <= 240 else 'not met'}**; mean accuracy
  of at least 70 %: **{'met' if results['mean_accuracy'] >= 0.70 else 'not met'}**; at least 5 \
points over Local:
  **{'met' if (results['gain_points'] or 0) >= 5 else 'not met'}**
{f"{chr(10)}The machine: {args.machine_note}{chr(10)}" if args.machine_note else ""}
| tier | Velo (%) | Local (%) | gain (points) | classes under 2 % of the tier's images | the \
tier's images per class (0–9) |
|---|---|---|---|---|---|
{tiers}

The weights of one depth are averaged over its {results['devices'] // 5} devices, so each tier's \
model learns from the
union of their data. Under Dir(0.5) that union still lacks some classes (the last two columns,
rebuilt from the run's partition); Felo/Velo's knowledge regularises each device on its own labels
and does not teach a class its depth group has almost no images of, so the tiers whose groups miss
classes stay lowest. For scale: the same models reach {iid} in `benchmarks/felo_velo` when each
device's data is IID (Local, 1,600 images per device, 12 rounds), and the paper's own CIFAR-10
numbers fall from 76 % (IID) to 57 % (Dir(0.5)).

Where the time goes ({results['rounds']} rounds, from `runs/demo/rounds.jsonl`): {timing}.

![accuracy per round](accuracy.png)
"""
    history = HERE / "HISTORY.md"  # hand-written notes (reruns, investigations): kept, appended
    if history.exists():
        notes = history.read_text()
        text += "\n" + notes.replace("# The demo's history", "## The demo's history", 1)
    (HERE / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (HERE / "README.md").write_text(text)
    png = args.run / "accuracy.png"
    if png.exists():
        (HERE / "accuracy.png").write_bytes(png.read_bytes())
    print(text)


if __name__ == "__main__":
    main()
