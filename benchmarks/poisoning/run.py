"""Poisoning: 20% of devices send well-formed but malicious updates; accuracy with and without
the defences of ``edgefl.algorithms.aggregate`` (issue 19).

Fleet: 10 devices on a subsample of Fashion-MNIST (IID, every device every round); devices d00
and d01 (2 of 10 = 20%) attack. Accuracy is the mean over the 8 honest devices of their final
evaluation on the test subsample (FedAvg: the global model; FedProto: each device's own model).

Attacks, applied by an attacker to its uplink after its honest local work; ``ref`` is what the
device received this round for that tensor or class (FedAvg: the global weights; FedProto: the
global prototype of that class, once the server has one), else 0:

- ``scale``       every float array: ref + 10·(x − ref)
- ``signflip``    every float array: ref − 4·(x − ref)
- ``scale_x100``  every float array: ref + 100·(x − ref) (FedProto: scaled prototypes)
- ``wrong_class`` (FedProto) the prototype of class y is replaced by ref_y + 5·(x_{y+1} − ref_y),
                  x_{y+1} the attacker's own prototype of class y+1 (mod C): with 2 of 10 devices
                  sending it, the mean lands on class y+1's prototype, so every honest device is
                  pulled to map class y where class y+1 lies.

Every attacked uplink passes every wire check: finite float32 of the declared shapes.

Defences (method options): ``none`` (the method's mean), ``median`` (coordinate-wise),
``trimmed_mean`` (trim 0.2: the 2 largest and 2 smallest of 10 values per coordinate dropped),
``clip`` (``clip_norm``: FedAvg bounds each device's weight update, FedProto each class
prototype's distance from the global one). The clip bound is calibrated on the clean cells: the
median of what honest devices sent there (the same quantity the server bounds), so it needs the
clean cells first; it is recorded in results.json.

Per cell the benchmark also records, over the honest devices' local training, the mean
cross-entropy and the mean of the method's knowledge term (FedProto: λ·MSE to the global
prototypes) — how much the payload steers training — and for FedProto the distance of the
global prototypes from the honest devices' class means.

A cell whose training broke down (every device's local loss non-finite, so the round loop
stops) is counted as "diverged": the attack won outright.

The attack is attached by wrapping the method's device half in this process (a simulated fleet);
over MQTT the same payloads would arrive from a device's own process.

    nice -n 10 python -m benchmarks.poisoning.run            # all cells, 3 seeds
    python -m benchmarks.poisoning.run --quick              # one seed, 2 rounds (smoke test)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.common import machine, write_json  # noqa: E402
from benchmarks.poisoning.attacks import (  # noqa: E402
    ATTACKERS,
    CLIENTS,
    FACTORS,
    PULL,
    Probe,
    install_attack,
)
from benchmarks.timing import command_line
from edgefl.algorithms import get_algorithm  # noqa: E402
from edgefl.config import resolve_config  # noqa: E402
from edgefl.errors import EdgeflError  # noqa: E402
from edgefl.report import recorder  # noqa: E402
from edgefl.runtime import simulation  # noqa: E402

# skip the per-run plots (the machine is shared)
simulation.finish_run = lambda rec, summary, plots=True: recorder.finish_run(
    rec, summary, plots=False
)

HERE = Path(__file__).parent
#: the attacks run per method (all of FACTORS and wrong_class are implemented for every method
#: listed; one each fits the shared machine's CPU: pass --attacks to run others)
ATTACKS = {"fedavg": ("scale",), "fedhe": ("wrong_class",), "fedproto": ("wrong_class", "scale")}
#: per method: data, rounds and local epochs, and the settings that differ from its defaults
#: (the knowledge methods on one CNN tier: the cell is about aggregation)
CNN = {"model": "cnn", "tiers": ("2",), "width": 0.5, "model_options": {}}
SETTINGS = {
    "fedavg": {"train_samples": 10000, "rounds": 6, "epochs": 1},
    "fedhe": {"train_samples": 6000, "rounds": 5, "epochs": 1, **CNN},
    "fedproto": {"train_samples": 6000, "rounds": 5, "epochs": 1, **CNN},
}
#: FedProto's cells show why prototypes barely steer training (see the CE / knowledge-term column);
#: its defences are tested in tests/test_defences.py, here only the median is run
METHOD_DEFENCES = {"fedproto": ("none", "median")}
DEFENCES = {
    "none": {},
    "median": {"aggregator": "median"},
    "trimmed_mean": {"aggregator": "trimmed_mean", "trim": 0.2},
    "clip": {"clip_norm": None},  # calibrated on the clean cells
}


def run_cell(
    method: str, attack: str | None, defence: str, seed: int, args, clip: float | None
) -> dict:
    settings = {**SETTINGS[method], **({"rounds": 2} if args.quick else {})}
    options = dict(DEFENCES[defence])
    if defence == "clip":
        options["clip_norm"] = clip
    explicit = {
        "algorithm": method,
        "dataset": "fashion-mnist",
        "data_dir": args.data_dir,
        "clients": CLIENTS,
        "epochs": settings["epochs"],
        "rounds": settings["rounds"],
        "partition": "iid",
        "fraction": 1.0,  # every device every round: the attackers always take part
        "train_samples": settings["train_samples"],
        "test_samples": args.test,
        "eval_samples": 500,
        "eval_every": settings["rounds"],  # only the final evaluation counts here
        "seed": seed,
        "threads": 1,
        "options": {k: str(v) for k, v in options.items()},
        "run_name": f"{method}-{attack}-{defence}-{seed}",
        **{k: v for k, v in settings.items() if k not in ("train_samples", "rounds", "epochs")},
    }
    algo = get_algorithm(method)
    probe = Probe()
    undo = install_attack(method, attack, probe)
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    cell = {
        "method": method,
        "attack": attack or "none",
        "defence": defence,
        "seed": seed,
        "options": options,
        "settings": {k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()},
    }
    try:
        with tempfile.TemporaryDirectory() as out:
            cfg = resolve_config({**explicit, "out_dir": out}, dict(algo.defaults))
            summary = simulation.simulate(cfg, plots=False)
    except EdgeflError as e:  # the attack broke training: every device's loss went non-finite
        return {
            **cell,
            "honest_accuracy": None,
            "diverged": str(e)[:200],
            "seconds": time.perf_counter() - t0,
        }
    finally:
        undo()
    honest = [a for d, a in summary["client_accuracy"].items() if d not in ATTACKERS]
    probes = {"honest_sent": probe.sent}
    if probe.ce:
        probes.update(
            {
                "honest_ce": statistics.mean(probe.ce),
                "honest_knowledge_term": statistics.mean(probe.term),
            }
        )
    if probe.proto_error:
        probes["prototype_error_last_round"] = probe.proto_error[-1]
    return {
        **cell,
        "honest_accuracy": statistics.mean(honest),
        "mean_accuracy": summary["mean_accuracy"],
        "seconds": time.perf_counter() - t0,
        "cpu_seconds": time.process_time() - cpu0,
        **probes,
    }


def calibrate(results: list[dict], method: str) -> float | None:
    """The clip bound: the median of what honest devices sent in the clean cells."""
    sent = [
        x
        for r in results
        if r["method"] == method and r["attack"] == "none" and r["defence"] == "none"
        for x in r.get("honest_sent", [])
    ]
    return float(np.median(sent)) if sent else None


def table(results: list[dict]) -> list[str]:
    cells: dict[tuple, list[dict]] = {}
    for r in results:
        cells.setdefault((r["method"], r["attack"], r["defence"]), []).append(r)
    order = {d: i for i, d in enumerate(DEFENCES)}
    lines = [
        "| method | attack | defence | honest devices' accuracy, % (mean ± sd) | per seed | "
        "diverged | CE / knowledge term |",
        "|---|---|---|---|---|---|---|",
    ]
    for (m, a, d), rs in sorted(
        cells.items(), key=lambda kv: (kv[0][0], kv[0][1] != "none", kv[0][1], order[kv[0][2]])
    ):
        rs = sorted(rs, key=lambda r: r["seed"])
        done = [r["honest_accuracy"] for r in rs if r["honest_accuracy"] is not None]
        sd = statistics.stdev(done) if len(done) > 1 else 0.0
        acc = (
            f"{100 * statistics.mean(done):.1f} ± {100 * sd:.1f}" if done else "— (no run finished)"
        )
        per_seed = ", ".join(
            "div." if r["honest_accuracy"] is None else f"{100 * r['honest_accuracy']:.1f}"
            for r in rs
        )
        terms = [(r["honest_ce"], r["honest_knowledge_term"]) for r in rs if "honest_ce" in r]
        term = (
            f"{statistics.mean(t[0] for t in terms):.3f} / "
            f"{statistics.mean(t[1] for t in terms):.4f}"
            if terms
            else ""
        )
        lines.append(f"| {m} | {a} | {d} | {acc} | {per_seed} | {len(rs) - len(done)} | {term} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument(
        "--attacks",
        default="",
        help="override the attacks, e.g. fedavg=scale+signflip;fedhe=signflip",
    )
    ap.add_argument(
        "--defences",
        default="",
        help="only these defences (e.g. trimmed_mean,clip: to split the cells over processes)",
    )
    ap.add_argument(
        "--seed-list",
        default="",
        help="only these seeds (e.g. 0,1: to split the cells over processes)",
    )
    ap.add_argument("--test", type=int, default=2000, help="test images")
    ap.add_argument("--methods", default="fedavg,fedhe,fedproto")
    ap.add_argument(
        "--no-cost", action="store_true", help="skip the defences' cost without an attack"
    )
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument(
        "--quick", action="store_true", help="one seed, 2 rounds, into --out (a smoke test)"
    )
    ap.add_argument(
        "--report", action="store_true", help="only rewrite results.json/md from the cell files"
    )
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.quick:
        args.seeds = 1
    cells_dir = args.out / "cells"
    command = command_line("benchmarks.poisoning.run", argv)
    if args.report:
        write_results(args, command)
        return
    methods = args.methods.split(",")
    attacks = dict(ATTACKS)
    for item in filter(None, args.attacks.split(";")):
        m, _, names = item.partition("=")
        attacks[m] = tuple(names.split("+"))
    only = set(args.defences.split(",")) if args.defences else set(DEFENCES)
    # clean cells first (they calibrate the clip bound), then attacks without and with each
    # defence, then the defences' cost without an attack
    order = [(m, None, "none") for m in methods]
    order += [
        (m, a, d) for m in methods for a in attacks[m] for d in METHOD_DEFENCES.get(m, DEFENCES)
    ]
    if not args.no_cost:
        order += [
            (m, None, d) for m in methods for d in METHOD_DEFENCES.get(m, DEFENCES) if d != "none"
        ]
    order = [c for c in order if c[2] in only]
    seeds = [int(x) for x in args.seed_list.split(",")] if args.seed_list else range(args.seeds)
    for method, attack, defence in order:
        for seed in seeds:
            path = cells_dir / f"{method}-{attack or 'none'}-{defence}-{seed}.json"
            settings = {**SETTINGS[method], **({"rounds": 2} if args.quick else {})}
            if path.exists() and json.loads(path.read_text()).get("settings") == json.loads(
                json.dumps(settings)
            ):
                continue  # resume: a finished cell of the same settings is kept
            clip = calibrate(_cells(cells_dir), method) if defence == "clip" else None
            if defence == "clip" and clip is None:
                print(f"skip {path.name}: no clean cell to calibrate the clip bound", flush=True)
                continue
            r = run_cell(method, attack, defence, seed, args, clip)
            r["command"] = command
            r["load_after"] = [round(x, 2) for x in os.getloadavg()]
            write_json(path, r)
            print(json.dumps({k: v for k, v in r.items() if k != "honest_sent"}), flush=True)
            write_results(args, command)
    print("done", flush=True)


def _cells(cells_dir: Path) -> list[dict]:
    return [json.loads(f.read_text()) for f in sorted(cells_dir.glob("*.json"))]


def write_results(args, command: str) -> None:
    results = _cells(args.out / "cells")
    clips = {m: calibrate(results, m) for m in sorted({r["method"] for r in results})}
    commands = sorted({r.get("command", "") for r in results})
    write_json(
        args.out / "results.json",
        {
            "commands": commands,
            "machine": machine(),
            "settings": SETTINGS,
            "attackers": list(ATTACKERS),
            "factors": FACTORS,
            "wrong_class_pull": PULL,
            "clip_norm": clips,
            "results": results,
        },
    )
    loads = [r["load_after"][0] for r in results if "load_after" in r]
    cpu = sum(r.get("cpu_seconds", 0.0) for r in results)
    md = [
        f"# Poisoning: {len(ATTACKERS)} of {CLIENTS} devices send malicious updates",
        "",
        "Command(s): "
        + ", ".join(f"`{c}`" for c in commands)
        + " (the cells are files under cells/; processes may run side by side)  ",
        f"Fashion-MNIST IID over {CLIENTS} devices, every device every round, test on {args.test} "
        "images; "
        f"attackers {', '.join(ATTACKERS)} ({100 * len(ATTACKERS) // CLIENTS}%); accuracy is the "
        "mean over the "
        f"{CLIENTS - len(ATTACKERS)} honest devices (FedAvg: the global model; FedHe and "
        "FedProto: each device's own model).  ",
        "Per method: "
        + "; ".join(
            f"{m}: {v['train_samples']} training images, {v['rounds']} rounds × {v['epochs']} "
            "local epoch"
            + (f", CNN tier {v['tiers'][0]} width {v['width']}" if "tiers" in v else "")
            for m, v in SETTINGS.items()
        )
        + ".  ",
        f"Attacks: `scale` ×{FACTORS['scale']:g} and `signflip` ×{FACTORS['signflip']:g} of the "
        "update from what the device received; "
        "`wrong_class`: class y's knowledge (FedHe: logit row; FedProto: prototype) moved "
        f"×{PULL:g} towards the attacker's own of class y+1.  ",
        "Clip bounds (median of what honest devices sent in the clean cells — FedAvg: the weight "
        "update's L2 norm; FedHe: "
        "a class logit row's distance from the server's; FedProto: a class prototype's): "
        + ", ".join(f"{m} {c:.3f}" if c is not None else f"{m} —" for m, c in sorted(clips.items()))
        + "  ",
        f"Total CPU {cpu / 60:.1f} min over {len(results)} cells; 1-min load after each cell "
        + (f"{min(loads):.1f}–{max(loads):.1f}" if loads else "—")
        + f".  \nMachine at the last write: {json.dumps(machine())}",
        "",
        *table(results),
        "",
        "CE / knowledge term: the honest devices' mean cross-entropy and mean knowledge term of "
        "their loss (FedHe: α·KL to the "
        "class logits; FedProto: λ·MSE to the global prototypes) over every local step of the "
        "cell.",
        "",
        "Why a wrong-class payload barely moves a knowledge method's accuracy here: both methods "
        "add the payload's term to "
        "the device's own cross-entropy on its own labels. FedHe: per sample, CE(p, y) + "
        "α·KL(q‖p) is smallest at "
        "p = (e_y + α·q)/(1 + α), whose largest entry is still y for any target q when α < 1 (the "
        "default α is 0.5): "
        "a poisoned class target can soften a device's predictions but not turn them on the "
        "samples it trains on. "
        "FedProto: λ·MSE pulls features towards the class prototypes while the head is trained by "
        "CE alone; a "
        "prototype table whose classes are permuted (wrong_class) is still a set of distinct "
        "targets, and the head "
        "learns where each class now lies. What can harm FedProto is magnitude: scaled prototypes "
        "make the MSE term "
        "dominate (the knowledge-term column of the scale_x100 cells, where run).",
    ]
    (args.out / "results.md").write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
