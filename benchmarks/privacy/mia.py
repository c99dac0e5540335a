"""Membership inference against a device's per-class statistics uplink (FedProto's prototypes,
Felo's mean [logits, features]), with and without local DP.

The question of issue 40: does a per-class mean over a handful of a device's images reveal them,
and does local DP stop it? One attack, the strongest we can give the server: it knows the
device's model after local training (white-box) and the device's uplink (its per-class mean
features as FedProto sends them; Felo's mean [logits, features]), and scores a candidate image x
of class y by how close its statistics vector v(x) (the one the device's uplink averages) is to
the uplinked mean of y: score = −‖v(x) − mean_y‖. A member (one of
the device's training images) is part of that mean, so it sits closer. Non-members: as many test
images of the same classes. An image of a class the device did not report (DP reports a class
only when its noisy count is clearly above zero) gets one score shared with its non-member: the
uplink says nothing about it. Attack AUC = P(score(member) > score(non-member)); 0.5 = no signal.

Fleet: Fashion-MNIST, Dir(0.5) over 100 devices of a 6,000-image subsample (about 60 images a
device), each method's device half on CNN tier 2 at width 0.5 with a 128-d feature (Felo knowledge
only, SGD 0.05 at batch 32; FedProto its defaults otherwise), one local epoch
(round 0 of a run), the uplink made by the run assembly exactly as a run makes it (``PrivateDevice``
with ``--dp local``: each sample's vector clipped to C, noisy sums and counts, the noisy means
projected onto the C-ball; the noise multiplier the one that spends ε on this single release).
ε ∈ {1, 4, 8, ∞}, δ = 1e-5, C = 20. The weight methods (FedAvg, FedDW): mia_weights.py (below).
20 devices per seed, seeds 0–2 (the partition, the models and the noise change with the seed).

    nice -n 10 python -m benchmarks.privacy.mia   # writes benchmarks/privacy/mia.json and mia.md
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.common import machine  # noqa: E402
from benchmarks.provenance import code_version  # noqa: E402
from edgefl.config import resolve_config  # noqa: E402
from edgefl.runtime.setup import assemble  # noqa: E402

HERE = Path(__file__).parent
EPSILONS = (1.0, 4.0, 8.0, None)  # None: no DP
SEEDS = (0, 1, 2)
DEVICES = 20  # attacked per seed
CLIP = 20.0


#: method → its settings in this fleet (each on CNN tier 2 at width 0.5 with a 128-d feature)
METHODS = {
    "fedproto": {},
    "felo": {
        "options": {"average_weights": "false"},
        "optimizer": "sgd",
        "lr": 0.05,
        "batch_size": 32,
        "model_options": {},
    },
}


def config(method: str, seed: int, epsilon: float | None, quick: bool):
    own = dict(METHODS[method].get("options", {}))
    options = (
        own
        if epsilon is None
        else {
            **own,
            "dp": "local",
            "dp_target_epsilon": str(epsilon),
            "dp_delta": "1e-5",
            "dp_clip": str(CLIP),
        }
    )
    from edgefl.algorithms import get_algorithm

    explicit = {
        "algorithm": method,
        "dataset": "fashion-mnist",
        "model": "cnn",
        "tiers": ("2",),
        "width": 0.5,
        "feature_dim": 128,
        "clients": 100,
        "partition": "dirichlet",
        "alpha": 0.5,
        "train_samples": 6000,
        "test_samples": 2000,
        "rounds": 1,
        "epochs": 1,
        "fraction": 1.0,
        "seed": seed,
        "threads": 1,
        "out_dir": "/tmp/unused",
        **{k: v for k, v in METHODS[method].items() if k != "options"},
        "options": options,
    }
    if quick:
        explicit.update(train_samples=3000, clients=50)
    return resolve_config(explicit, dict(get_algorithm(method).defaults))


def auc(members: np.ndarray, others: np.ndarray) -> float:
    """P(member score > non-member score), ties counted half (the Mann–Whitney statistic)."""
    from scipy.stats import rankdata

    ranks = rankdata(np.concatenate([members, others]))
    n1, n2 = len(members), len(others)
    return float((ranks[:n1].sum() - n1 * (n1 + 1) / 2) / (n1 * n2))


@torch.no_grad()
def vectors(half, blocks, x: torch.Tensor) -> np.ndarray:
    """Each image's statistics vector (its rows of every uplinked block, concatenated), eval
    mode."""
    half.model.eval()
    out = half.sample_vectors(x)
    return np.concatenate([out[b].double().flatten(1).numpy() for b in blocks], 1)


def uplinked_means(up, stats) -> dict[int, np.ndarray]:
    """class → the per-class mean the uplink carries (the classes it reports)."""
    rows = np.concatenate([np.asarray(up.arrays[b], np.float64) for b in stats.blocks], 1)
    if stats.classes:
        return {int(c): rows[i] for i, c in enumerate(up.arrays[stats.classes])}
    counts = np.asarray(up.arrays[stats.counts]) if stats.counts else np.ones(len(rows))
    return {c: rows[c] for c in range(len(rows)) if counts[c] > 0}


def attack_device(
    run, device_id: str, test_x: torch.Tensor, test_y: np.ndarray, rng: np.random.Generator
) -> float:
    half = run.device_half(device_id)
    up = half.fit(0)
    stats = run.method.release.stats
    means = uplinked_means(up, stats)
    data = half.ctx.train_data
    xs, ys = next(iter(data.batches(len(data), shuffle=False)))
    ys = ys.numpy()
    members = vectors(half, stats.blocks, xs)
    # as many non-members of the same classes, from the test split
    picks = [int(rng.choice(np.flatnonzero(test_y == c))) for c in ys]
    others = vectors(half, stats.blocks, test_x[picks])

    def score(f: np.ndarray, y: np.ndarray) -> np.ndarray:
        """−distance to the uplinked mean of the class; one score for every image of a class the
        device did not report (the uplink says nothing about them: ties, AUC 0.5)."""
        out = np.full(len(y), -1e9)
        for i, c in enumerate(y):
            if int(c) in means:
                out[i] = -np.linalg.norm(f[i] - means[int(c)])
        return out

    return auc(score(members, ys), score(others, ys))


def main(argv: list[str]) -> None:
    quick = "--quick" in argv
    torch.set_num_threads(1)
    seeds, devices = (SEEDS[:1], 5) if quick else (SEEDS, DEVICES)
    before, t0 = machine(), time.perf_counter()
    rows = []
    for method in METHODS:
        for epsilon in EPSILONS:
            aucs = []
            for seed in seeds:
                run = assemble(config(method, seed, epsilon, quick))
                test = run.data.evals["test"]
                test_x, test_y = next(iter(test.batches(len(test), shuffle=False)))
                rng = np.random.default_rng([seed, 5])
                for d in run.ids[:devices]:
                    aucs.append(attack_device(run, d, test_x, test_y.numpy(), rng))
            rows.append(
                {
                    "method": method,
                    "epsilon": "inf" if epsilon is None else epsilon,
                    "devices": len(aucs),
                    "auc_mean": statistics.fmean(aucs),
                    "auc_sd": statistics.stdev(aucs),
                    "auc_max": max(aucs),
                    "aucs": aucs,
                }
            )
            print(
                f"{method} ε={rows[-1]['epsilon']}: attack AUC {rows[-1]['auc_mean']:.3f} ± "
                f"{rows[-1]['auc_sd']:.3f} "
                f"over {len(aucs)} devices",
                flush=True,
            )
    out = {
        "benchmark": "privacy/mia",
        "code": code_version(),
        "clip": CLIP,
        "delta": 1e-5,
        "seeds": list(seeds),
        "devices_per_seed": devices,
        "rows": rows,
        "wall_seconds": time.perf_counter() - t0,
        "machine": {"before": before, "after": machine()},
        "command": "nice -n 10 python -m benchmarks.privacy.mia" + (" --quick" if quick else ""),
    }
    target = Path("runs/bench-quick/privacy-mia") if quick else HERE
    target.mkdir(parents=True, exist_ok=True)
    previous = (
        json.loads((target / "mia.json").read_text()) if (target / "mia.json").exists() else {}
    )
    if "weight_methods" in previous:  # mia_weights.py's rows: kept
        out["weight_methods"] = previous["weight_methods"]
    write(out, target)


def write(out: dict, target: Path) -> None:
    """mia.json and mia.md: the statistics uplinks (this module) and, when measured, the weight
    methods (``out["weight_methods"]``, :mod:`benchmarks.privacy.mia_weights`)."""
    (target / "mia.json").write_text(json.dumps(out, indent=1) + "\n")
    before = out["machine"]["before"]
    lines = [
        "# Membership inference against the uplinks and models, with and without DP",
        "",
        "## Per-class statistics uplinks (FedProto, Felo), local DP",
        "",
        (__doc__ or "").split("\n\n    nice")[0].strip(),
        "",
        "| method | ε (δ = 1e-5) | devices attacked | attack AUC (mean ± sd over devices) | "
        "largest AUC |",
        "|---|---|---|---|---|",
        *[
            f"| {r['method']} | {r['epsilon']} | {r['devices']} | {r['auc_mean']:.3f} ± "
            f"{r['auc_sd']:.3f} | {r['auc_max']:.3f} |"
            for r in out["rows"]
        ],
        "",
        f"`{out['command']}` (at {out['code']}): {out['wall_seconds']:.0f} s; load before "
        f"{before['loadavg_1_5_15']} (machine in mia.json).",
    ]
    weights = out.get("weight_methods")
    if weights:
        from benchmarks.privacy.mia_weights import page

        lines += ["", *page(weights)]
    (target / "mia.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
