"""Loss-threshold membership inference (Yeom et al., 2018) against the weight methods: FedAvg's
released global model (with and without central DP) and FedDW's device uplinks (with and without
local DP). The companion of :mod:`benchmarks.privacy.mia`, which attacks the per-class
statistics uplinks (FedProto, Felo); the same fleet, ε points and seeds.

The attack: a model that has trained on an image tends to have a lower loss on it than on an
image it never saw, so the attacker scores a candidate (x, y) by −CE(model(x), y) and calls the
higher scores members. Members: training images of the attacked data; non-members: as many test
images of the same classes (drawn per member, as mia.py). Attack AUC = P(score(member) >
score(non-member)), ties half; 0.5 = no signal.

- **FedAvg, the released global model** (``--dp central``: the server clips each device's update
  and noises their mean; what anyone who receives the model sees). The whole run of the fleet:
  10 rounds, every device every round, one local epoch, SGD 0.05 (the privacy benchmark's FedAvg
  recipe), the noise multiplier the one that spends ε over the 10 rounds, clip 1.5 (the privacy
  benchmark's). Members: 1,000 of the fleet's training images; one AUC per seed.
- **FedDW, a device's uplink** (``--dp local``: the device clips its weights around the received
  model and noises them before the uplink; the server sees this): round 0 of a run (the server's
  first downlink received, one local epoch), the uplinked weights loaded into the device's model;
  clip 0.77 (the privacy benchmark's), the noise multiplier the one that spends ε on this single
  release. Members: the device's own training images (about 60). 20 devices a seed.

Fleet (mia.py's): Fashion-MNIST, Dir(0.5) over 100 devices of a 6,000-image subsample (about 60
images a device), CNN tier 2 at width 0.5; FedDW its defaults otherwise (its head, Adam).
ε ∈ {1, 4, 8, ∞} at δ = 1e-5, seeds 0–2 (the partition, the models and the noise change with the
seed). Beside FedDW's rows, the median over the attacked devices of ‖uplink − received‖: without
DP the update itself, with DP mostly the noise. The attacker gets the white-box model and exact
labels: the strongest loss-threshold attacker.

    nice -n 10 python -m benchmarks.privacy.mia_weights   # into mia.json (weight_methods), mia.md

(or in two processes: ``… --epsilons 1,4 --part A.json & … --epsilons 8,inf --part B.json``,
then ``… --merge A.json,B.json``)
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks.common import machine  # noqa: E402
from benchmarks.privacy.mia import auc  # noqa: E402
from benchmarks.provenance import code_version  # noqa: E402
from edgefl.config import resolve_config  # noqa: E402
from edgefl.runtime.setup import assemble  # noqa: E402

HERE = Path(__file__).parent
EPSILONS = (1.0, 4.0, 8.0, None)  # None: no DP
SEEDS = (0, 1, 2)
DEVICES = 20  # FedDW devices attacked per seed
MEMBERS = 1000  # FedAvg: training images of the fleet scored per seed
ROUNDS = 10  # FedAvg's run
CLIPS = {"fedavg": 1.5, "feddw": 0.77}  # the privacy benchmark's (benchmarks/privacy/__init__.py)
MODES = {"fedavg": "central", "feddw": "local"}


def config(method: str, seed: int, epsilon: float | None, quick: bool):
    from edgefl.algorithms import get_algorithm

    options = {} if epsilon is None else {
        "dp": MODES[method], "dp_target_epsilon": str(epsilon), "dp_delta": "1e-5",
        "dp_clip": str(CLIPS[method])}
    explicit = {
        "algorithm": method, "dataset": "fashion-mnist", "model": "cnn", "tiers": ("2",),
        "width": 0.5, "clients": 100, "partition": "dirichlet", "alpha": 0.5,
        "train_samples": 6000, "test_samples": 2000, "rounds": 1, "epochs": 1, "fraction": 1.0,
        "seed": seed, "threads": 1, "out_dir": "/tmp/unused", "options": options,
    }
    if method == "fedavg":  # the whole run; its final evaluation on 500 test images a device
        explicit.update(rounds=ROUNDS, lr=0.05, eval_every=0, test_samples=500)
    if quick:
        explicit.update(train_samples=3000, clients=50)
        if method == "fedavg":
            explicit.update(rounds=3, test_samples=200)
    return resolve_config(explicit, dict(get_algorithm(method).defaults))


@torch.no_grad()
def scores(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """−cross-entropy of each image under ``model`` (eval mode): the loss-threshold score. A
    non-finite loss (a model the noise blew up) scores lowest."""
    model.eval()
    out = []
    for i in range(0, len(x), 500):
        out.append(-F.cross_entropy(model(x[i:i + 500]), y[i:i + 500], reduction="none").double())
    s = torch.cat(out).numpy()
    return np.where(np.isfinite(s), s, -np.inf)


def nonmembers(ys: np.ndarray, test_y: np.ndarray, rng: np.random.Generator) -> list[int]:
    """One test image of the same class per member (mia.py's draw)."""
    return [int(rng.choice(np.flatnonzero(test_y == c))) for c in ys]


def attack_fedavg(cfg, seed: int, members: int) -> dict:
    """Run FedAvg (in memory, the run's own assembly and loop), load the server's final global
    model (the release) and score ``members`` of the fleet's training images against as many
    test images."""
    import tempfile

    from edgefl.runtime.simulation import simulate
    from edgefl.wire import arrays_to_state

    run = assemble(cfg)
    servers: list = []
    with tempfile.TemporaryDirectory(prefix="edgefl-mia-") as tmp:
        summary = simulate(cfg.model_copy(update={"out_dir": tmp, "run_name": "run"}), None,
                           plots=False, on_done=servers.append)
    model = copy.deepcopy(run.device_half(run.ids[0]).model)
    model.load_state_dict(arrays_to_state(servers[0].state_dict(), "w/"), strict=True)
    xs, ys = zip(*(next(iter(run.device_half(d).ctx.train_data.batches(10**6, shuffle=False)))
                   for d in run.ids), strict=True)
    x, y = torch.cat(xs), torch.cat(ys)
    rng = np.random.default_rng([seed, 7])
    pick = rng.choice(len(x), size=min(members, len(x)), replace=False)
    # non-members from 2,000 test images (the run evaluated on fewer, to save time)
    test = assemble(cfg.model_copy(update={"test_samples": 2000})).data.evals["test"]
    test_x, test_y = next(iter(test.batches(len(test), shuffle=False)))
    others = nonmembers(y[pick].numpy(), test_y.numpy(), rng)
    value = auc(scores(model, x[pick], y[pick]), scores(model, test_x[others], test_y[others]))
    return {"auc": value, "accuracy": summary["mean_accuracy"]}


def attack_feddw(cfg, seed: int, devices: int) -> tuple[list[float], list[float]]:
    """Each of ``devices`` FedDW devices: receive the server's first downlink, train (round 0),
    uplink (noised on the device under local DP); score its training images against as many
    test images under the uplinked weights. Returns (AUCs, update norms ‖uplink − received‖)."""
    from edgefl.algorithms import DeviceRecord
    from edgefl.runtime.setup import build_server
    from edgefl.wire import arrays_to_state

    run = assemble(cfg)
    halves = {d: run.device_half(d) for d in run.ids[:devices]}
    fleet = {d: DeviceRecord(spec=run.specs[d], num_samples=len(h.ctx.train_data))
             for d, h in halves.items()}
    server = build_server(run.method, run.server_context(fleet))
    test = run.data.evals["test"]
    test_x, test_y = next(iter(test.batches(len(test), shuffle=False)))
    rng = np.random.default_rng([seed, 5])
    aucs, norms = [], []
    for d, half in halves.items():
        down = server.downlink(0, d)
        half.receive(0, down)
        up = half.fit(0)
        weights = {k: v for k, v in up.arrays.items() if k.startswith("w/")}
        norms.append(float(np.sqrt(sum(
            np.sum((np.asarray(v, np.float64) - np.asarray(down.arrays[k], np.float64)) ** 2)
            for k, v in weights.items() if np.issubdtype(np.asarray(v).dtype, np.floating)))))
        model = copy.deepcopy(half.model)
        model.load_state_dict(arrays_to_state(weights, "w/"), strict=True)
        xs, ys = next(iter(half.ctx.train_data.batches(len(half.ctx.train_data), shuffle=False)))
        others = nonmembers(ys.numpy(), test_y.numpy(), rng)
        aucs.append(auc(scores(model, xs, ys), scores(model, test_x[others], test_y[others])))
    return aucs, norms


def _row(method: str, epsilon: float | None, aucs: list[float], over: str, **extra) -> dict:
    return {"method": method, "epsilon": "inf" if epsilon is None else epsilon, "over": over,
            "n": len(aucs), "auc_mean": statistics.fmean(aucs),
            "auc_sd": statistics.stdev(aucs) if len(aucs) > 1 else 0.0, "auc_max": max(aucs),
            "aucs": aucs, **extra}


def main(argv: list[str]) -> dict:
    """``[--quick] [--epsilons 1,4] [--part FILE] [--merge FILE,FILE]``: ``--epsilons`` with
    ``--part`` measures those ε into FILE (so that ε run in parallel processes); ``--merge``
    stores parts together as one run would (rows in ε order)."""
    quick = "--quick" in argv
    target = Path("runs/bench-quick/privacy-mia") if quick else HERE
    if "--merge" in argv:
        parts = [
            json.loads(Path(f).read_text()) for f in argv[argv.index("--merge") + 1].split(",")
        ]
        order = ["inf" if e is None else e for e in EPSILONS]
        out = {**parts[0], "rows": sorted((r for p in parts for r in p["rows"]),
                                          key=lambda r: (order.index(r["epsilon"]), r["method"]))}
        out["wall_seconds"] = max(p["wall_seconds"] for p in parts)  # the parts ran side by side
        out["machine"] = {"before": parts[0]["machine"]["before"],
                          "after": parts[-1]["machine"]["after"],
                          "parts": [p["machine"] for p in parts]}
        out["command"] = " & ".join(p["command"] for p in parts)
        store(out, target)
        return out
    epsilons = EPSILONS
    if "--epsilons" in argv:
        epsilons = tuple(None if e == "inf" else float(e)
                         for e in argv[argv.index("--epsilons") + 1].split(","))
    torch.set_num_threads(1)
    seeds, devices = (SEEDS[:1], 5) if quick else (SEEDS, DEVICES)
    members = 300 if quick else MEMBERS
    before, t0 = machine(), time.perf_counter()
    rows = []
    for epsilon in epsilons:
        got = [attack_fedavg(config("fedavg", s, epsilon, quick), s, members) for s in seeds]
        rows.append(_row("fedavg", epsilon, [g["auc"] for g in got], "seeds",
                         target="released global model", accuracy=[g["accuracy"] for g in got]))
        aucs, norms = [], []
        for s in seeds:
            a, n = attack_feddw(config("feddw", s, epsilon, quick), s, devices)
            aucs += a
            norms += n
        rows.append(_row("feddw", epsilon, aucs, "devices", target="device uplink",
                         update_norm_median=statistics.median(norms)))
        for r in rows[-2:]:
            print(f"{r['method']} ε={r['epsilon']}: attack AUC {r['auc_mean']:.3f} ± "
                  f"{r['auc_sd']:.3f} over {r['n']} {r['over']}", flush=True)
    out = {"benchmark": "privacy/mia_weights", "code": code_version(), "clips": CLIPS,
           "delta": 1e-5, "seeds": list(seeds), "devices_per_seed": devices,
           "members_per_seed": members, "fedavg_rounds": 3 if quick else ROUNDS, "rows": rows,
           "wall_seconds": time.perf_counter() - t0,
           "machine": {"before": before, "after": machine()},
           "command": "nice -n 10 python -m benchmarks.privacy.mia_weights " + " ".join(argv)}
    if "--part" in argv:
        Path(argv[argv.index("--part") + 1]).write_text(json.dumps(out, indent=1) + "\n")
        return out
    store(out, target)
    return out


def store(out: dict, target: Path) -> None:
    """Into ``target``'s mia.json (under ``weight_methods``) and mia.md, beside mia.py's rows."""
    from benchmarks.privacy import mia

    path = target / "mia.json"
    if not path.exists():
        raise SystemExit(f"{path} missing: run python -m benchmarks.privacy.mia first")
    whole = json.loads(path.read_text())
    whole["weight_methods"] = out
    mia.write(whole, target)


def page(out: dict) -> list[str]:
    """mia.md's section for the weight methods."""
    before = out["machine"]["before"]
    lines = ["## Weight methods (FedAvg central DP, FedDW local DP): loss threshold", "",
             (__doc__ or "").split("\n\n    nice")[0].strip(), "",
             "| method | attacked | ε (δ = 1e-5) | attack AUC (mean ± sd) | over | largest AUC | "
             "beside it |", "|---|---|---|---|---|---|---|"]
    for r in out["rows"]:
        if r["method"] == "fedavg":
            accs = [100 * a for a in r["accuracy"] if a is not None]
            beside = "final accuracy " + (f"{statistics.fmean(accs):.1f} %" if accs else "—")
        else:
            beside = (f"median ‖uplink − received‖ {r['update_norm_median']:.3g} "
                      f"(clip {out['clips']['feddw']})")
        lines.append(f"| {r['method']} | {r['target']} | {r['epsilon']} | {r['auc_mean']:.3f} ± "
                     f"{r['auc_sd']:.3f} | {r['n']} {r['over']} | {r['auc_max']:.3f} | {beside} |")
    lines += ["", f"`{out['command']}` (at {out['code']}): {out['wall_seconds']:.0f} s; load "
                  f"before {before['loadavg_1_5_15']} (machine in mia.json, weight_methods)."]
    return lines


if __name__ == "__main__":
    main(sys.argv[1:])
