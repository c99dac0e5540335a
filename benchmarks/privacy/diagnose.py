"""Measured diagnostics for the privacy benchmark's settings (issue 40), on the validation split.

Two questions, answered from the run assembly's own device halves (round 0: one local epoch from
the initial model, the fleet the benchmark runs, a validation split of 1,000 images carved from
the training data; the test set is never read):

1. **DP-FedAvg (central).** Each device's update norm ‖Δ‖ (quantiles over the devices), the
   model's size d, and for a clip C: the norm of the mean of the clipped updates (the signal a
   round can move the model by) against the norm of the noise the server adds to that mean,
   z·C·√d / n (z: the noise multiplier that spends ε over the run's rounds). Their ratio does not
   depend on C once C is at or below the update norms (both scale with C): only n and ε move it.
2. **Per-class statistics under local DP (Felo, FedProto).** Each sample's statistics vector's
   norm (quantiles: the clip), and a device's per-class means after the noise against the true
   (clipped) means: the error ‖noisy − true‖ with and without projecting each noisy mean onto the
   C-ball (post-processing; the true mean of vectors clipped to C lies in that ball, so the
   projection never moves a release farther from it), and the largest softmax probability of the
   released mean logits (a target near one-hot in a random class drives a device to predict it).

    nice -n 10 python -m benchmarks.privacy.diagnose     # writes benchmarks/privacy/diagnose.json
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.common import machine  # noqa: E402
from edgefl.algorithms import get_algorithm  # noqa: E402
from edgefl.config import resolve_config  # noqa: E402
from edgefl.privacy.accountant import calibrate_noise  # noqa: E402
from edgefl.privacy.declare import ClassStats  # noqa: E402
from edgefl.privacy.mechanisms import class_sums, clip_rows, private_class_stats  # noqa: E402
from edgefl.runtime.setup import assemble  # noqa: E402
from edgefl.wire import state_to_arrays  # noqa: E402

HERE = Path(__file__).parent
EPSILONS = (1.0, 4.0, 8.0)
DELTA = 1e-5


def quantiles(xs) -> dict[str, float]:
    q = np.quantile(np.asarray(xs, float), [0.1, 0.5, 0.9])
    return {"p10": float(q[0]), "median": float(q[1]), "p90": float(q[2])}


def build(settings: dict, seed: int):
    explicit = {**settings, "seed": seed, "threads": 1, "out_dir": "/tmp/unused"}
    return assemble(resolve_config(explicit, dict(get_algorithm(explicit["algorithm"]).defaults)))


def fedavg_updates(
    settings: dict, seed: int, devices: int | None = None
) -> tuple[list[np.ndarray], int]:
    """Round-0 updates (flattened float weights: trained − initial) of the first ``devices``
    devices."""
    run = build(settings, seed)
    out = []
    for d in run.ids[: devices or len(run.ids)]:
        half = run.device_half(d)
        before = state_to_arrays(half.model.state_dict(), "w/")
        up = half.fit(0)
        keys = sorted(k for k, v in before.items() if np.asarray(v).dtype.kind == "f")
        out.append(
            np.concatenate(
                [(np.asarray(up.arrays[k], np.float64) - before[k]).ravel() for k in keys]
            )
        )
    return out, len(out[0])


def fedavg_table(
    settings: dict, rounds: int, seeds, n_devices: int, sample: int | None = None
) -> dict:
    """Update norms and the per-round signal/noise of DP-FedAvg with n = ``n_devices`` at C = median
    norm."""
    updates, d = [], 0
    for seed in seeds:
        u, d = fedavg_updates({**settings, "clients": n_devices}, seed, sample)
        updates += [(seed, x) for x in u]
    norms = [float(np.linalg.norm(x)) for _, x in updates]
    q = quantiles(norms)
    rows = []
    for clip in (q["p10"], q["median"]):
        signal = []
        for seed in seeds:
            xs = [x * min(1.0, clip / np.linalg.norm(x)) for s, x in updates if s == seed]
            signal.append(float(np.linalg.norm(np.mean(xs, axis=0))))
        for eps in EPSILONS:
            z = calibrate_noise(eps, DELTA, rounds)
            noise = z * clip * math.sqrt(d) / n_devices
            rows.append(
                {
                    "clip": clip,
                    "epsilon": eps,
                    "z": z,
                    "noise_std_on_mean": z * clip / n_devices,
                    "noise_norm_on_mean": noise,
                    "signal_norm": float(np.mean(signal)),
                    "noise_to_signal": noise / float(np.mean(signal)),
                }
            )
    return {
        "devices": n_devices,
        "d": d,
        "update_norm": q,
        "devices_measured": len(norms),
        "rows": rows,
    }


def local_weights_table(settings: dict, rounds: int, seeds, parts: int) -> dict:
    """FedDW's weights under local DP: each device's update clipped to C and noised with std z·2C
    per coordinate on the device; the server's mean of n carries noise of norm z·2C·√d/√n."""
    updates, d = [], 0
    for seed in seeds:
        u, d = fedavg_updates(settings, seed)
        updates += [(seed, x) for x in u]
    norms = [float(np.linalg.norm(x)) for _, x in updates]
    q = quantiles(norms)
    n = len(updates) // len(seeds)
    clip = q["median"]
    signal = float(
        np.mean(
            [
                np.linalg.norm(
                    np.mean(
                        [x * min(1.0, clip / np.linalg.norm(x)) for s, x in updates if s == seed], 0
                    )
                )
                for seed in seeds
            ]
        )
    )
    rows = []
    for eps in EPSILONS:
        z = calibrate_noise(eps, DELTA, rounds * parts)
        noise = z * 2 * clip * math.sqrt(d) / math.sqrt(n)
        rows.append(
            {
                "clip": clip,
                "epsilon": eps,
                "z": z,
                "noise_norm_on_mean": noise,
                "signal_norm": signal,
                "noise_to_signal": noise / signal,
            }
        )
    return {"devices": n, "d": d, "update_norm": q, "rows": rows}


def stats_table(settings: dict, rounds: int, seeds, clip: float | None) -> dict:
    """Per-sample statistics norms and the error of the released per-class means at each ε."""
    norms, errors = [], {e: {"raw": [], "projected": []} for e in EPSILONS}
    peak = {e: {"raw": [], "projected": [], "true": []} for e in EPSILONS}
    for seed in seeds:
        run = build(settings, seed)
        release = run.method.release
        stats = release.stats
        for i, d in enumerate(run.ids):
            half = run.device_half(d)
            half.fit(0)
            data = half.ctx.train_data
            x, _ = next(iter(data.batches(len(data), shuffle=False)))
            with torch.no_grad():
                half.model.eval()
                vec = half.sample_vectors(x)
                half.model.train()
            norms += np.linalg.norm(
                np.concatenate([vec[b].double().flatten(1).numpy() for b in stats.blocks], 1),
                axis=1,
            ).tolist()
            if clip is None:
                continue
            sums, counts = class_sums(
                half.sample_vectors, half.model, data, stats, half.ctx.num_classes, clip
            )
            held = counts > 0
            true = np.concatenate([sums[b] for b in stats.blocks], 1)[held] / counts[held, None]
            for eps in EPSILONS:
                z = calibrate_noise(eps, DELTA, rounds * release.parts)
                rng = np.random.default_rng([seed, i, 99])
                # the mechanism's noisy sums and counts (dense, the same draws as a mean release),
                # divided as the mean release divides them: the means before the projection
                dense = ClassStats(stats.blocks, reduce="sum", counts="count")
                floats = {k: np.float64 for k in (*stats.blocks, "count")}
                out = private_class_stats(sums, counts, dense, clip, z, rng, floats)
                noisy = np.concatenate([np.asarray(out[b], np.float64) for b in stats.blocks], 1)[
                    held
                ]
                noisy_counts = np.asarray(out["count"])[held]
                reported = noisy_counts > 0
                if not reported.any():
                    continue
                raw = noisy[reported] / np.maximum(noisy_counts[reported], 1.0)[:, None]
                projected = clip_rows(raw, clip)  # what the mean release sends
                errors[eps]["raw"] += np.linalg.norm(raw - true[reported], axis=1).tolist()
                errors[eps]["projected"] += np.linalg.norm(
                    projected - true[reported], axis=1
                ).tolist()
                if "logit" in stats.blocks:
                    w = out["logit"].shape[1]
                    for name, arr in (
                        ("raw", raw),
                        ("projected", projected),
                        ("true", true[reported]),
                    ):
                        p = torch.softmax(torch.tensor(arr[:, :w]), 1).max(1).values
                        peak[eps][name] += p.tolist()
    table = {"sample_norm": quantiles(norms), "clip": clip, "rows": []}
    for eps in EPSILONS:
        if not errors[eps]["raw"]:
            continue
        row = {
            "epsilon": eps,
            "z": calibrate_noise(eps, DELTA, rounds * run.method.release.parts),
            "error_raw": quantiles(errors[eps]["raw"]),
            "error_projected": quantiles(errors[eps]["projected"]),
        }
        if peak[eps]["raw"]:
            row["max_softmax"] = {k: float(np.median(v)) for k, v in peak[eps].items()}
        table["rows"].append(row)
    return table


def validate(tag: str, workers: int = 1) -> dict:
    """Felo and FedProto at ε = 1, seeds 0–1, on the validation split: final validation accuracy
    and collapsed devices, for the code as it is (``tag`` names it: raw / projected)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    from benchmarks import gates
    from benchmarks.cells import Cell, _worker_init, run_cell
    from benchmarks.privacy import FEDPROTO, FELO, label, options, profile

    base = {**profile(False), "validation_samples": 1000}
    cells = [Cell(label(m, 1), "validation", s, {**base, **settings, "options": options(m, 1)})
             for m, settings in (("felo", FELO), ("fedproto", FEDPROTO)) for s in (0, 1)]
    rows = []
    with ProcessPoolExecutor(
        workers, mp_context=mp.get_context("spawn"), initializer=_worker_init
    ) as pool:
        for r in pool.map(run_cell, cells):
            rows.append(
                {
                    "method": r["method"],
                    "seed": r["seed"],
                    "validation_accuracy": r["final_accuracy"],
                    "slope": r["slope"],
                    "collapsed": gates.run_collapse(r),
                    "code": r["code"],
                }
            )
            print(tag, rows[-1], flush=True)
            (HERE / f"diagnose-validate-{tag}.json").write_text(
                json.dumps({"tag": tag, "rows": rows}, indent=1) + "\n"
            )
    return {"tag": tag, "rows": rows}


def main(argv: list[str]) -> None:
    from benchmarks.privacy import CLIPS, FEDAVG, FEDDW, FEDPROTO, FELO, options, profile

    if argv and argv[0] == "validate":
        t0, before = time.perf_counter(), machine()
        out = validate(argv[1])
        out.update(
            wall_seconds=time.perf_counter() - t0, machine={"before": before, "after": machine()}
        )
        (HERE / f"diagnose-validate-{argv[1]}.json").write_text(json.dumps(out, indent=1) + "\n")
        return

    torch.set_num_threads(1)
    base = {**profile(False), "validation_samples": 1000}
    rounds = base["rounds"]
    seeds = (0, 1)
    t0, before = time.perf_counter(), machine()
    out = {"benchmark": "privacy/diagnose", "rounds": rounds, "delta": DELTA, "seeds": list(seeds)}
    only = argv[0] if argv else "all"
    if only in ("all", "fedavg"):
        out["fedavg_10"] = fedavg_table({**base, **FEDAVG}, rounds, seeds, 10)
        print(json.dumps(out["fedavg_10"], indent=1), flush=True)
        big = {**base, **FEDAVG, "train_samples": 6000}
        out["fedavg_100"] = fedavg_table(big, rounds, seeds[:1], 100)
        print(json.dumps(out["fedavg_100"], indent=1), flush=True)
    if only in ("all", "feddw"):
        out["feddw_weights"] = local_weights_table({**base, **FEDDW}, rounds, seeds, parts=2)
        print(json.dumps(out["feddw_weights"], indent=1), flush=True)
    if only in ("all", "stats"):
        for name, settings in (
            ("felo", {**FELO, "options": options("felo", None)}),
            ("fedproto", FEDPROTO),
        ):
            # the clip the benchmark declares: the median of these norms at round 0, rounded
            out[name] = stats_table({**base, **settings}, rounds, seeds, float(CLIPS[name]))
            print(name, json.dumps(out[name], indent=1), flush=True)
    out.update(
        wall_seconds=time.perf_counter() - t0, machine={"before": before, "after": machine()}
    )
    (HERE / f"diagnose-{only}.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
