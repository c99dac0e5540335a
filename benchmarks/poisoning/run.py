"""Poisoning: 20% of devices send well-formed but malicious updates; accuracy with and without
the defences of ``edgefl.algorithms.aggregate`` (issue 19).

Fleet: 5 devices on a subsample of Fashion-MNIST (IID), device d00 (20%) attacks; a few
local steps per round (CPU-sized: the machine is shared). Attacks,
applied to every float array an attacker uplinks (after its honest local work):

- ``scale``:    ref + 10·(x − ref)
- ``signflip``: ref − 4·(x − ref)

where ref is the array of the same name and shape the device received this round (FedAvg: the
global weights; FedProto: the global prototypes once every class has one), else 0. Both pass every wire check:
finite float32 of the declared shapes.

A cell whose training broke down (every device's local loss non-finite, so the round loop
stops) is counted as "diverged": the attack won outright.

Defences (method options): ``mean`` (none), ``median``, ``trimmed_mean`` (trim 0.2),
``clip`` (``clip_norm``: FedAvg 3.0 on the weight update, FedProto 12.0 on each prototype's
distance from the global one: about the largest an honest device sent in a clean pilot run).
≥ 3 seeds per cell; seeds run outermost and results are written after every cell.

The benchmark attaches the attack by wrapping the method's device half in this process (a
simulated fleet); over MQTT the same payloads would arrive from a device's own process.

    nice -n 10 python -m benchmarks.poisoning.run            # all cells, 3 seeds
    python -m benchmarks.poisoning.run --quick              # one seed, fewer rounds (smoke test)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.common import machine, write_json  # noqa: E402
from edgefl.algorithms import get_algorithm  # noqa: E402
from edgefl.config import resolve_config  # noqa: E402
from edgefl.errors import EdgeflError  # noqa: E402
from edgefl.runtime import simulation  # noqa: E402

# Cells differ only in attack and defence: load Fashion-MNIST once, and skip the per-run plots
# (the machine is shared; a cell is a few seconds of training).
simulation.load_dataset = functools.lru_cache(maxsize=4)(simulation.load_dataset)
simulation.finish_run = lambda recorder, summary: None

HERE = Path(__file__).parent
ATTACKERS = ("d00",)
FACTORS = {"scale": 10.0, "signflip": -4.0}
CORE_ATTACK = {"fedavg": "scale", "fedproto": "signflip"}
CLIP = {"fedavg": 3.0, "fedproto": 12.0}
DEFENCES = {
    "none": {},
    "median": {"aggregator": "median"},
    "trimmed_mean": {"aggregator": "trimmed_mean", "trim": 0.2},
    "clip": {"clip_norm": None},  # filled per method from CLIP
}


HONEST_NORMS: dict[str, list[float]] = {}  # what honest devices send: the clip bounds' yardstick


def _distance(arrays, received) -> float:
    """L2 distance of an uplink's float arrays from what the device received (0 where absent)."""
    total = 0.0
    for name, a in arrays.items():
        if a.dtype.kind == "f":
            ref = received.get(name)
            ref = 0.0 if ref is None or ref.shape != a.shape else ref.astype(np.float64)
            total += float(np.sum((a.astype(np.float64) - ref) ** 2))
    return total**0.5


def install_attack(method: str, attack: str | None):
    """Wrap the method's device half: attackers rewrite their uplink. Returns an undo function."""
    cls = get_algorithm(method).device
    receive, fit = cls.receive, cls.fit

    def attacked_receive(self, round, payload):
        self._received = {k: np.array(v) for k, v in payload.arrays.items()}
        return receive(self, round, payload)

    def attacked_fit(self, round):
        up = fit(self, round)
        received = getattr(self, "_received", {})
        if attack is None or self.ctx.device_id not in ATTACKERS:
            HONEST_NORMS.setdefault(method, []).append(_distance(up.arrays, received))
            return up
        factor = FACTORS[attack]
        for name, a in list(up.arrays.items()):
            if a.dtype.kind != "f":
                continue
            ref = received.get(name)
            ref = np.zeros_like(a) if ref is None or ref.shape != a.shape else ref.astype(a.dtype)
            up.arrays[name] = (ref + factor * (a - ref)).astype(a.dtype)
        return up

    cls.receive, cls.fit = attacked_receive, attacked_fit

    def undo():
        cls.receive, cls.fit = receive, fit

    return undo


def run_cell(method: str, attack: str | None, defence: str, seed: int, rounds: int, train: int, data_dir: str, steps: int) -> dict:
    options = dict(DEFENCES[defence])
    if defence == "clip":
        options["clip_norm"] = CLIP[method]
    explicit = {
        "algorithm": method,
        "dataset": "fashion-mnist",
        "data_dir": data_dir,
        "clients": 5,
        "steps": steps,
        "rounds": rounds,
        "partition": "iid",
        "fraction": 1.0,  # every device every round: the attacker always takes part
        "train_samples": train,
        "test_samples": 1000,
        "eval_samples": 500,
        "eval_every": rounds,  # only the final evaluation counts here
        "seed": seed,
        "threads": 1,
        "options": {k: str(v) for k, v in options.items()},
        "run_name": f"{method}-{attack}-{defence}-{seed}",
    }
    if method == "fedproto":
        explicit.update({"tiers": ("2",), "width": 0.5})  # one CNN tier: the cell is about aggregation
    algo = get_algorithm(method)
    undo = install_attack(method, attack)
    t0 = time.perf_counter()
    cell = {"method": method, "attack": attack or "none", "defence": defence, "seed": seed}
    try:
        with tempfile.TemporaryDirectory() as out:
            cfg = resolve_config({**explicit, "out_dir": out}, dict(algo.defaults))
            summary = simulation.simulate(cfg)
    except EdgeflError as e:  # the attack broke training: every device's loss went non-finite
        return {**cell, "honest_accuracy": None, "diverged": str(e)[:200], "seconds": time.perf_counter() - t0}
    finally:
        undo()
    honest = [a for d, a in summary["client_accuracy"].items() if d not in ATTACKERS]
    return {**cell, "honest_accuracy": statistics.mean(honest), "mean_accuracy": summary["mean_accuracy"], "seconds": time.perf_counter() - t0}


def _spread(values: list[float]) -> dict:
    return {"median": float(np.median(values)), "p90": float(np.percentile(values, 90)), "max": float(np.max(values)), "n": len(values)}


def table(results: list[dict]) -> list[str]:
    cells: dict[tuple, list[float | None]] = {}
    for r in results:
        cells.setdefault((r["method"], r["attack"], r["defence"]), []).append(r["honest_accuracy"])
    lines = ["| method | attack | defence | honest devices' accuracy, % (mean ± sd over seeds) | seeds | training diverged |", "|---|---|---|---|---|---|"]
    for (m, a, d), accs in sorted(cells.items()):
        done = [x for x in accs if x is not None]
        sd = statistics.stdev(done) if len(done) > 1 else 0.0
        acc = f"{100 * statistics.mean(done):.1f} ± {100 * sd:.1f}" if done else "— (no run finished)"
        lines.append(f"| {m} | {a} | {d} | {acc} | {len(accs)} | {len(accs) - len(done)} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8, help="local minibatch steps per round")
    ap.add_argument("--train", type=int, default=1500, help="training images (subsample of Fashion-MNIST)")
    ap.add_argument("--methods", default="fedavg,fedproto")
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--report", action="store_true", help="only rewrite results.md from results.json")
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.report:
        old = json.loads((args.out / "results.json").read_text())
        write_results(args, old["command"], old["rounds"], old["results"], old.get("honest_update_norms", {}))
        return
    seeds = range(1 if args.quick else args.seeds)
    rounds = 2 if args.quick else args.rounds
    methods = args.methods.split(",")
    grid = [(m, None, "none") for m in methods] + [(m, a, d) for m in methods for a in FACTORS for d in DEFENCES]
    # the cells that answer "does a defence help?" first (on a shared machine the rest may wait):
    # per method, the clean run, one attack without and with the median, for every seed
    core = [(m, a, d) for m in methods for (a, d) in ((None, "none"), (CORE_ATTACK[m], "none"), (CORE_ATTACK[m], "median"))]
    order = [c for c in core if c in grid] + [c for c in grid if c not in core]
    command = "python -m benchmarks.poisoning.run " + " ".join(sys.argv[1:] if argv is None else argv)
    results = _previous(args.out / "results.json", rounds, args)  # resume: a finished cell is kept
    done = {(r["method"], None if r["attack"] == "none" else r["attack"], r["defence"], r["seed"]) for r in results}
    for method, attack, defence in order:
        for seed in seeds:
            if (method, attack, defence, seed) in done:
                continue
            r = run_cell(method, attack, defence, seed, rounds, args.train, args.data_dir, args.steps)
            results.append(r)
            print(json.dumps(r), flush=True)
            write_results(args, command, rounds, results)
    print("done", flush=True)


def _previous(path: Path, rounds: int, args) -> list[dict]:
    """The cells of an earlier run with the same settings (rounds, data, steps)."""
    if not path.exists():
        return []
    old = json.loads(path.read_text())
    if (old.get("rounds"), old.get("train_samples"), old.get("steps")) != (rounds, args.train, args.steps):
        return []
    return list(old["results"])


def write_results(args, command: str, rounds: int, results: list[dict], norms: dict | None = None) -> None:
    norms = {m: _spread(v) for m, v in HONEST_NORMS.items()} if norms is None else norms
    write_json(args.out / "results.json", {"command": command, "machine": machine(), "rounds": rounds, "train_samples": args.train, "steps": args.steps,
                                           "attackers": list(ATTACKERS), "factors": FACTORS, "clip_norm": CLIP,
                                           "honest_update_norms": norms, "results": results})
    md = [
        "# Poisoning: 1 of 5 devices sends malicious updates",
        "",
        f"Command: `{command}`  ",
        f"Fashion-MNIST, {args.train} training images IID over 5 devices, {rounds} rounds of {args.steps} local steps, test on 1000 images; "
        f"attacker {', '.join(ATTACKERS)} (20%); accuracy is the mean over the 4 honest devices.  ",
        f"Machine: {json.dumps(machine())}",
        "",
        *table(results),
        "",
        "What honest devices sent (L2 distance of their uplink's float arrays from what they received; "
        "FedProto: per uplink, all its prototypes), over every honest uplink of the cells the last process ran, "
        "attacked cells included (there a wrecked global model makes honest updates large): "
        + "; ".join(f"{m}: median {v['median']:.2f}, 90th percentile {v['p90']:.2f}, max {v['max']:.2f}" for m, v in norms.items())
        + f". Clip bounds used: {CLIP} (FedProto's applies per class prototype, so it is below the per-uplink figure).",
    ]
    (args.out / "results.md").write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
