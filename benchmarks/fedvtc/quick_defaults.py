"""Issue 17's quick command, ``edgefl simulate --algorithm fedvtc --clients 4 --rounds 3
--train-samples 3000``: which FedVTC run defaults it should use, chosen on a validation split.

Every candidate runs the quick command's configuration (the method's defaults for everything the
candidate does not set) on a stratified validation set carved from the training data — the test
set is never read — with 1,000 more training images drawn so that the devices keep the quick
command's 750 images each. The per-round evaluation uses the same validation images, so
``before`` (after the last training round) and ``after`` (after the synthetic fine-tune) compare
the same devices on the same images. The oracle (``benchmarks/fedvtc/oracle.safetensors``) scores
the averaged ψ; it does not change the run.

The candidates hold the quick command's training work to at most twice the old default's (6
device-epochs of 750 images: 2 of 4 devices × 3 rounds × 1 epoch), so the command stays within
its 2-minute budget on 2 cores with room for load. The choice is made by code: the best mean
validation accuracy over the seeds.

    python -m benchmarks.fedvtc.quick_defaults            # runs what is missing, writes the report
    python -m benchmarks.fedvtc.quick_defaults --report   # the report from the stored runs only
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT_JSON = HERE / "quick_defaults.json"
OUT_MD = HERE / "quick_defaults.md"
SEEDS = (0, 1)
VALIDATION = 1000
#: the quick command: --algorithm fedvtc --clients 4 --rounds 3 --train-samples 3000
QUICK = {"algorithm": "fedvtc", "clients": 4, "rounds": 3, "train_samples": 3000}
#: the quick command's local training: 6 device-epochs (the old defaults) or 12
TRAINING = {
    "epochs=1, fraction=0.3": {"epochs": 1, "fraction": 0.3},
    "epochs=2, fraction=0.3": {"epochs": 2, "fraction": 0.3},
    "epochs=1, fraction=1.0": {"epochs": 1, "fraction": 1.0},
}
#: the synthetic fine-tune: the paper's 𝒯 = 5 epochs at the run's lr (the old defaults), one
#: epoch, or 𝒯 = 5 at a tenth of the lr
FINETUNE = {
    "T=5": {"finetune_epochs": "5", "finetune_lr": "none"},
    "T=1": {"finetune_epochs": "1", "finetune_lr": "none"},
    "T=5, finetune_lr=0.001": {"finetune_epochs": "5", "finetune_lr": "0.001"},
}
#: name → settings over the method's defaults (the first: the defaults before this sweep); each
#: sets what it sweeps explicitly, so a later default does not change what a stored run means
CANDIDATES: dict[str, dict] = {
    f"{t}; {f}": {**ts, "options": fs} for t, ts in TRAINING.items() for f, fs in FINETUNE.items()
}
#: the runs stored before the fine-tune axis was added were named by their training alone
RENAMED = {t: f"{t}; T=5" for t in TRAINING}


def config(name: str, seed: int) -> dict:
    cand = CANDIDATES[name]
    return {
        **QUICK,
        "train_samples": QUICK["train_samples"] + VALIDATION,
        "validation_samples": VALIDATION,
        "eval_samples": VALIDATION,
        "seed": seed,
        "threads": 1,
        **{k: v for k, v in cand.items() if k != "options"},
        "options": {"oracle": "benchmarks/fedvtc/oracle.safetensors", **cand.get("options", {})},
    }


def run_one(name: str, seed: int) -> dict:
    from edgefl.algorithms import get_algorithm
    from edgefl.config import resolve_config
    from edgefl.runtime.simulation import simulate

    explicit = config(name, seed)
    with tempfile.TemporaryDirectory(prefix="edgefl-quick-") as tmp:
        explicit = {**explicit, "out_dir": tmp, "run_name": "run"}
        cfg = resolve_config(explicit, dict(get_algorithm("fedvtc").defaults))
        load0, cpu0, t0 = (
            os.getloadavg(),
            resource.getrusage(resource.RUSAGE_SELF),
            time.perf_counter(),
        )
        summary = simulate(cfg, plots=False)
        wall, cpu1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
        rounds = [
            json.loads(line)
            for line in (Path(tmp) / "run" / "rounds.jsonl").read_text().splitlines()
        ]
    last = next(r for r in rounds if r["round"] == cfg.rounds)  # the last training round (from 1)
    # the closing round
    server = next((r.get("server") or {} for r in rounds if r["round"] == cfg.rounds + 1), {})
    return {
        "candidate": name,
        "seed": seed,
        "settings": CANDIDATES[name],
        "after": summary["mean_accuracy"],
        "before": last["eval"]["mean_accuracy"],
        "device_after": summary["client_accuracy"],
        "device_before": last["eval"]["client_accuracy"],
        "trained": {
            d: sum(d in r.get("completed", []) for r in rounds if r.get("phase") == "train")
            for d in summary["client_accuracy"]
        },
        "oracle_agreement": server.get("oracle_agreement"),
        "device_agreement": server.get("device_agreement"),
        "wall_s": wall,
        "cpu_s": (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime),
        "load_start": load0,
        "load_end": os.getloadavg(),
    }


def choose(runs: list[dict]) -> tuple[str, dict[str, list[dict]]]:
    by = {n: [r for r in runs if r["candidate"] == n] for n in CANDIDATES}
    complete = {n: rs for n, rs in by.items() if {r["seed"] for r in rs} >= set(SEEDS)}
    best = max(complete, key=lambda n: statistics.fmean(r["after"] for r in complete[n]))
    return best, by


def report(runs: list[dict]) -> str:
    best, by = choose(runs)
    changes = [statistics.fmean(r["after"] - r["before"] for r in rs) for rs in by.values() if rs]
    lowered = sum(c < 0 for c in changes)

    def ms(xs):
        xs = [x for x in xs if x is not None]
        if not xs:
            return "—"
        return f"{100 * statistics.fmean(xs):.2f}" + (
            f" ± {100 * statistics.stdev(xs):.2f}" if len(xs) > 1 else ""
        )

    lines = [
        "# FedVTC quick-command defaults (issue 17), chosen on a validation split",
        "",
        "Configuration: `edgefl simulate --algorithm fedvtc --clients 4 --rounds 3 "
        "--train-samples 3000` with "
        f"{VALIDATION} more training images carved out as a stratified validation set (devices "
        "keep 750 images "
        f"each; the test set is never read), one torch thread. Seeds {list(SEEDS)}. Accuracy: "
        "mean over devices "
        "on the validation set, in %; **before**: after the last training round; **after**: after "
        "the synthetic "
        "fine-tune (the run's result). **oracle**: share of the averaged ψ's samples the central "
        "classifier "
        "assigns to the intended class; **device**: each device's model on its own ψ_k. Wall and "
        "CPU seconds "
        "are per run, on a shared 2-core machine (load average at the start in the runs table).",
        "",
        "Candidates: the local training at most doubled (6 device-epochs of 750 images at the old "
        "defaults, "
        "12 at the others, so the command stays within its 2-minute budget on 2 cores) × the "
        "synthetic "
        "fine-tune (the paper's 𝒯 = 5 epochs at the run's lr, SGD 0.01 with momentum 0.9; one "
        "epoch; "
        "𝒯 = 5 at lr 0.001).",
        "",
        f"Choice (code: the best mean validation accuracy after the fine-tune): **{best}**. The "
        "fine-tune "
        f"lowers the mean accuracy in {lowered} of {len(changes)} candidates (its change is the "
        "mean over seeds "
        "of after − before).",
        "",
        "| candidate | after (val %) | before (val %) | fine-tune (points) | oracle % | device % "
        "| wall s | CPU s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, rs in by.items():
        if not rs:
            continue
        change = [r["after"] - r["before"] for r in rs]
        lines.append(
            f"| {n}{' (chosen)' if n == best else ''} | {ms(r['after'] for r in rs)} | "
            f"{ms(r['before'] for r in rs)} | "
            f"{statistics.fmean(change) * 100:+.2f} | {ms(r['oracle_agreement'] for r in rs)} | "
            f"{ms(r['device_agreement'] for r in rs)} | "
            f"{statistics.fmean(r['wall_s'] for r in rs):.0f} | "
            f"{statistics.fmean(r['cpu_s'] for r in rs):.0f} |"
        )
    lines += [
        "",
        "## Runs",
        "",
        "| candidate | seed | after | before | per device after (before) | epochs trained per "
        "device | oracle | wall s | load at start |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        per = ", ".join(
            f"{d} {100 * a:.1f} ({100 * r['device_before'][d]:.1f})"
            for d, a in r["device_after"].items()
        )
        trained = ", ".join(
            f"{d} {n * r['settings'].get('epochs', 1)}" for d, n in r["trained"].items()
        )
        lines.append(
            f"| {r['candidate']} | {r['seed']} | {100 * r['after']:.2f} | {100 * r['before']:.2f} "
            f"| {per} | {trained} | "
            f"{ms([r['oracle_agreement']])} | {r['wall_s']:.0f} | "
            f"{r['load_start'][0]:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--report", action="store_true", help="write the report from the stored runs only"
    )
    args = parser.parse_args()
    runs = json.loads(OUT_JSON.read_text())["runs"] if OUT_JSON.exists() else []
    for r in runs:
        r["candidate"] = RENAMED.get(r["candidate"], r["candidate"])
        r["settings"] = CANDIDATES[r["candidate"]]
    done = {(r["candidate"], r["seed"]) for r in runs}
    if not args.report:
        for seed in SEEDS:
            for name in CANDIDATES:
                if (name, seed) in done:
                    continue
                print(f"running {name}, seed {seed}", flush=True)
                runs.append(run_one(name, seed))
                r = runs[-1]
                print(
                    f"  after {100 * r['after']:.2f} before {100 * r['before']:.2f} wall "
                    f"{r['wall_s']:.0f} s",
                    flush=True,
                )
                OUT_JSON.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    order = list(CANDIDATES)
    runs.sort(
        key=lambda r: (
            order.index(r["candidate"]) if r["candidate"] in order else len(order),
            r["seed"],
        )
    )
    best, _ = choose(runs)
    OUT_JSON.write_text(json.dumps({"chosen": best, "runs": runs}, indent=1) + "\n")
    OUT_MD.write_text(report(runs))
    print(f"chosen: {best}")


if __name__ == "__main__":
    main()
