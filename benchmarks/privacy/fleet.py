"""How many devices a round central DP needs before its noise is no larger than the update it
protects (issue 37): the calculation behind the benchmark's DP-FedAvg fleet.

DP-FedAvg (``--dp central``) clips each device's update to C, averages n of them with equal
weights and adds N(0, (z·C/n)²) to every one of the model's d weights: the noise on the mean has
norm z·C·√d/n. The signal it hides is the norm of the mean of the n clipped updates, ‖Δ̄_C‖. Their
ratio, z·C·√d / (n·‖Δ̄_C‖), is what this script writes, for n = 10 … 3,000 devices a round and
ε ∈ {1, 4, 8} at δ = 1e-5:

- d: the float weights of the model the benchmark's FedAvg trains (CNN tier 2 at width 0.25);
- z: the noise multiplier edgefl's accountant calibrates for ε over the run's rounds, one
  Gaussian mechanism a round (:func:`edgefl.privacy.accountant.calibrate_noise`, the calibration
  the runs use: :func:`edgefl.privacy.seam.noise_multiplier_for`);
- ‖Δ̄_C‖: measured, never assumed. Each fleet is the benchmark's setting (Fashion-MNIST Dir(0.5),
  FedAvg's model and recipe, one local epoch) over the whole training set less a 1,000-image
  validation split (59,000 images over n devices: about 59,000/n a device); every device trains
  round 0 from the initial model and its update (trained − initial weights) is kept; C is the
  median of the n update norms (how the benchmark chooses its clips) and ‖Δ̄_C‖ the norm of the
  mean of the n clipped updates. The test set is never read (the evaluation split is the
  validation split, and nothing is evaluated).

The round-0 process time of the n fits is recorded beside each fleet: it is one round's training
at that fleet, the basis of the benchmark's cost estimate.

    nice -n 19 python -m benchmarks.privacy.fleet      # writes fleet.json and fleet.md here
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.common import machine  # noqa: E402
from benchmarks.privacy.diagnose import fedavg_updates  # noqa: E402
from edgefl.privacy.accountant import calibrate_noise  # noqa: E402
from edgefl.privacy.seam import central_noise  # noqa: E402

HERE = Path(__file__).parent
EPSILONS = (1.0, 4.0, 8.0)
DELTA = 1e-5
FLEETS = (10, 100, 300, 1000, 3000)
VALIDATION = 1000
TRAIN = 60_000  # Fashion-MNIST's training set
#: "at most about the update's norm": the noise's norm within this factor of the signal's
ABOUT = 1.25


def min_size(n: int) -> int:
    """The Dirichlet split's smallest shard: the profile's 10 images, 2 where devices hold about
    20 (3,000 devices: no Dir(0.5) draw in 1,000 gives every device 5; the smallest of a draw
    is 1-2)."""
    return 10 if n <= 1000 else 2


def measure(n: int, seed: int, rounds: int) -> dict:
    """Round-0 updates of an ``n``-device fleet over the whole training pool: their norms, the
    median clip, the clipped mean's norm, and the process time of the fits."""
    from benchmarks.privacy import FEDAVG, profile

    settings = {**profile(False), **FEDAVG, "clients": n, "train_samples": None,
                "validation_samples": VALIDATION, "min_size": min_size(n)}
    t0 = time.process_time()
    updates, d = fedavg_updates(settings, seed)
    fit_cpu = time.process_time() - t0
    norms = np.array([np.linalg.norm(x) for x in updates])
    clip = float(np.median(norms))
    mean = np.mean([x * min(1.0, clip / max(nx, 1e-300)) for x, nx in zip(updates, norms,
                                                                      strict=True)], axis=0)
    signal = float(np.linalg.norm(mean))
    rows = []
    for eps in EPSILONS:
        z = calibrate_noise(eps, DELTA, rounds)
        noise = central_noise(z, clip, n, d)  # what the server states at setup
        rows.append({"epsilon": eps, "z": z, "noise_std_per_coordinate": noise["std"],
                     "noise_norm": noise["norm"], "noise_to_signal": noise["norm"] / signal})
    return {
        "devices": n,
        "seed": seed,
        "images_per_device": (TRAIN - VALIDATION) / n,
        "min_size": settings["min_size"],
        "d": d,
        "update_norm": {"p10": float(np.quantile(norms, 0.1)), "median": clip,
                        "p90": float(np.quantile(norms, 0.9))},
        "clip": clip,
        "signal_norm": signal,
        "signal_over_clip": signal / clip,
        "fit_cpu_seconds": fit_cpu,
        "rows": rows,
    }


def smallest(fleets: list[dict]) -> dict[str, int | None]:
    """Per ε, the fewest devices a round whose noise is at most about the signal (``ABOUT``)."""
    out = {}
    for eps in EPSILONS:
        ok = [f["devices"] for f in fleets for r in f["rows"]
              if r["epsilon"] == eps and r["noise_to_signal"] <= ABOUT]
        out[f"{eps:g}"] = min(ok) if ok else None
    return out


def extrapolate(fleets: list[dict], z: dict[str, float], d: int) -> dict:
    """A power law fitted to the measured n·‖Δ̄_C‖/C (least squares in log-log over the fleets):
    per ε, the n at which the noise's norm equals the signal's, beyond the measured range where
    it falls there (an extrapolation, marked so), and the images a device would then hold."""
    x = np.log([f["devices"] for f in fleets])
    y = np.log([f["devices"] * f["signal_over_clip"] for f in fleets])
    slope, intercept = np.polyfit(x, y, 1)
    out = {"exponent": float(slope), "per_epsilon": {}}
    for eps, zz in z.items():
        n = float(np.exp((math.log(zz * math.sqrt(d)) - intercept) / slope))
        out["per_epsilon"][eps] = {"devices": n, "images_per_device": (TRAIN - VALIDATION) / n}
    return out


def feddw_need() -> dict | None:
    """FedDW's weights under local DP (``--dp local``): each device adds N(0, (z·2C)²) to every
    weight itself, so the mean of n carries noise of norm z·2C·√d/√n, falling only as √n. From the
    noise/signal measured at 10 devices (diagnose-feddw.json, validation split), the devices a
    round at which it would reach 1 if the signal held its 10-device value: 10·ratio² (generous:
    the mean clipped update shrinks as devices hold less data, rows above)."""
    path = HERE / "diagnose-feddw.json"
    if not path.exists():
        return None
    table = json.loads(path.read_text())["feddw_weights"]
    n0 = table["devices"]
    return {"devices": n0, "d": table["d"], "rows": [
        {"epsilon": r["epsilon"], "z": r["z"], "noise_to_signal": r["noise_to_signal"],
         "devices_for_ratio_1": n0 * r["noise_to_signal"] ** 2} for r in table["rows"]]}


def page(out: dict) -> str:
    lines = [
        "# Central DP's noise against the update it protects, by devices a round",
        "",
        f"Command: `{out['command']}` at `{out['commit']}`; {out['wall_seconds']:.0f} s; load "
        f"{out['machine']['before']['loadavg_1_5_15']} → "
        f"{out['machine']['after']['loadavg_1_5_15']}.",
        "",
        f"Model: CNN tier 2 at width 0.25, **d = {out['d']:,}** float weights. "
        f"{out['rounds']} rounds, one mechanism a round, δ = {DELTA:g}; z from "
        "`edgefl.privacy.accountant.calibrate_noise` (the runs' calibration): "
        + ", ".join(f"ε = {e}: **z = {z:.2f}**" for e, z in out["z"].items()) + ".",
        "",
        "Each fleet: Fashion-MNIST Dir(0.5) over the training set less a 1,000-image validation "
        "split (59,000 images), FedAvg's model and recipe, seed "
        f"{out['seed']}; C = the median round-0 update norm; signal = ‖mean of the n clipped "
        "updates‖ (measured); noise = z·C·√d / n. The test set is never read.",
        "",
        "| n | images a device | ‖Δ‖ p10 / median / p90 | signal ‖Δ̄_C‖ (÷ C) | "
        "noise/signal ε=1 | ε=4 | ε=8 | round-0 fits, CPU s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for f in out["fleets"]:
        q = f["update_norm"]
        ratios = " | ".join(f"**{r['noise_to_signal']:.2f}**" for r in f["rows"])
        lines.append(
            f"| {f['devices']:,} | {f['images_per_device']:.0f} | {q['p10']:.3f} / "
            f"{q['median']:.3f} / {q['p90']:.3f} | {f['signal_norm']:.4f} "
            f"({f['signal_over_clip']:.3f}) | {ratios} | {f['fit_cpu_seconds']:.1f} |")
    lines += ["", f"Fewest devices a round with noise/signal ≤ {ABOUT:g} (\"at most about the "
              "update's norm\"): " + ", ".join(
                  f"ε = {e}: {'none of these' if n is None else f'{n:,}'}"
                  for e, n in out["smallest"].items()) + ".", ""]
    ex = out["extrapolated"]
    lines += [
        f"Extrapolated (a power law n·‖Δ̄_C‖/C ∝ n^{ex['exponent']:.2f} fitted to the rows above; "
        "beyond the measured fleets): the noise's norm equals the signal's at "
        + ", ".join(f"ε = {e}: n ≈ {v['devices']:,.0f} ({v['images_per_device']:.1f} images a "
                    "device)" for e, v in ex["per_epsilon"].items())
        + ". Fashion-MNIST's 59,000 training images cannot hold a fleet past a few images a "
        "device.",
        "",
    ]
    dw = out.get("feddw")
    if dw:
        lines += [
            f"**FedDW's weights under local DP** (d = {dw['d']:,}): each device noises its own "
            "weights, so the noise on the mean falls only as √n. Measured at "
            f"{dw['devices']} devices (diagnose-feddw.json, validation split): "
            + ", ".join(f"ε = {r['epsilon']:g}: {r['noise_to_signal']:,.0f}× the signal, "
                        f"1× at n ≈ {r['devices_for_ratio_1']:.1e} devices"
                        for r in dw["rows"])
            + " (10·ratio², holding the signal at its 10-device value: generous, it shrinks "
            "with the data a device holds).",
            "",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    from benchmarks.privacy import profile
    from benchmarks.provenance import code_version

    p = argparse.ArgumentParser(prog="python -m benchmarks.privacy.fleet")
    p.add_argument("--fleets", type=int, nargs="+", default=list(FLEETS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=profile(False)["rounds"])
    p.add_argument("--out", type=Path, default=HERE)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    t0, before = time.perf_counter(), machine()
    fleets = []
    for n in args.fleets:
        fleets.append(measure(n, args.seed, args.rounds))
        print(json.dumps({k: v for k, v in fleets[-1].items() if k != "rows"}), flush=True)
    out = {
        "benchmark": "privacy/fleet",
        "command": "nice -n 19 python -m benchmarks.privacy.fleet "
        + " ".join(f"--fleets {' '.join(map(str, args.fleets))}".split())
        + f" --seed {args.seed} --rounds {args.rounds}",
        "commit": code_version(),
        "seed": args.seed,
        "rounds": args.rounds,
        "delta": DELTA,
        "d": fleets[0]["d"],
        "z": {f"{e:g}": calibrate_noise(e, DELTA, args.rounds) for e in EPSILONS},
        "fleets": fleets,
        "smallest": smallest(fleets),
        "feddw": feddw_need(),
        "extrapolated": extrapolate(
            fleets, {f"{e:g}": calibrate_noise(e, DELTA, args.rounds) for e in EPSILONS},
            fleets[0]["d"]),
        "wall_seconds": time.perf_counter() - t0,
        "machine": {"before": before, "after": machine()},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fleet.json").write_text(json.dumps(out, indent=1) + "\n")
    (args.out / "fleet.md").write_text(page(out))
    print(page(out))


if __name__ == "__main__":
    main()
