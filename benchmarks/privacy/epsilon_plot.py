"""Accuracy against the privacy budget ε, from the committed results (no run here):

    python -m benchmarks.privacy.epsilon_plot      # writes benchmarks/privacy/epsilon.png

Felo, FedProto, FedDW (local DP) and DP-FedAvg (central DP) are the runner's cells
(results.json); a run that stopped because every device failed a round (its record's
``stop_reason``: a collapse) is counted and left out of the mean, one stopped by a spent privacy
budget is in it. FedAvg with DP-SGD is dp_sgd.json's fleet of the same size. Means over 3 seeds,
bars one standard deviation; Local and the two bounds as lines."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).parent
BUDGETS = ["1", "4", "8", "∞"]


def _points() -> dict[str, dict[str, list[float]]]:
    acc: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    results = json.loads((HERE / "results.json").read_text())
    for run in results["runs"]:
        method, _, eps = run["method"].partition(" ε=")
        if method != "local":  # None: the run stopped, every device failing (a collapse)
            failed = run.get("stop_reason") == "every device failed"
            acc[method][eps].append(None if failed else run["final_accuracy"])
    for cell in json.loads((HERE / "dp_sgd.json").read_text())["cells"]:
        if cell["train_samples"] == 3000:
            eps = "∞" if cell["epsilon"] is None else f"{cell['epsilon']:g}"
            acc["fedavg DP-SGD"][eps].append(cell["mean_accuracy"])
    return acc, results


def main() -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    acc, results = _points()
    local = statistics.mean(r["final_accuracy"] for r in results["runs"] if r["method"] == "local")
    labels = {
        "felo": "Felo (local DP)",
        "fedproto": "FedProto (local DP)",
        "fedavg": "FedAvg (central DP)",
        "feddw": "FedDW (local DP)",
        "fedavg DP-SGD": "FedAvg (DP-SGD on the device)",
    }
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, (method, label) in enumerate(labels.items()):
        xs, ys, sds, notes = [], [], [], []
        for x, eps in enumerate(BUDGETS):
            values = acc[method].get(eps, [])
            done = [100 * v for v in values if v is not None]
            if done:
                xs.append(x + (i - 2) * 0.06)
                ys.append(statistics.mean(done))
                sds.append(statistics.stdev(done) if len(done) > 1 else 0.0)
            if len(done) < len(values):
                notes.append(
                    (x + (i - 2) * 0.06,
                     f"{len(values) - len(done)} of {len(values)} stopped (all failed)")
                )
        ax.errorbar(xs, ys, yerr=sds, marker="o", capsize=3, label=label)
        for x, text in notes:
            ax.annotate(text, (x, 22), fontsize=7, rotation=90, va="bottom", ha="center")
    bounds = results["bounds"]
    for y, ls, c, name in ((bounds["centralized"], ":", "k", "centralized bound"),
                           (bounds["local_iid"], "-.", "grey", "Local-IID bound"),
                           (local, "--", "grey", "Local (no uplink)")):
        ax.axhline(100 * y, ls=ls, c=c, lw=1, label=f"{name} {100 * y:.1f} %")
    ax.set_xticks(range(len(BUDGETS)), [f"ε = {b}" for b in BUDGETS])
    ax.set_xlabel("privacy budget per device (δ = 1e-5)")
    ax.set_ylabel("final test accuracy (%)")
    ax.set_ylim(0, 100)
    ax.set_title("Fashion-MNIST Dir(0.5), 10 devices, 16 rounds, 3 seeds", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    fig.tight_layout()
    out = HERE / "epsilon.png"
    fig.savefig(out, dpi=120)
    return out


if __name__ == "__main__":
    print(main())
