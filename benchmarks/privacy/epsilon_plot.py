"""Accuracy against the privacy budget ε, from the committed results (no run here):

    python -m benchmarks.privacy.epsilon_plot      # writes benchmarks/privacy/epsilon.png

Felo, FedProto, FedDW (local DP) and DP-FedAvg (central DP) are the runner's cells
(results.json); a run that stopped because every device failed a round (its record's
``stop_reason``: a collapse) is counted and left out of the mean, one stopped by a spent privacy
budget is in it. FedAvg with DP-SGD is dp_sgd.json's 10-device fleet. Means over 3 seeds, bars
one standard deviation; the two bounds and each fleet's Local as lines (DP-FedAvg runs on the
1,000-device fleet, the others on 10 devices: a Local per fleet, never their mean)."""

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
    fleets = {"fleet1000": "Local, 1,000 devices (DP-FedAvg's fleet)",
              "dir0.5": "Local, 10 devices (the others' fleet)"}
    locals_ = {
        name: statistics.mean(rs)
        for setting, name in fleets.items()
        if (rs := [r["final_accuracy"] for r in results["runs"]
                   if r["method"] == "local" and r["setting"] == setting])
    }
    labels = {
        "felo": "Felo (local DP)",
        "fedproto": "FedProto (local DP)",
        "fedavg": "FedAvg (central DP, 1,000 devices)",
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
        if not xs and not notes:  # a method with no cell in the grid draws nothing
            continue
        ax.errorbar(xs, ys, yerr=sds, marker="o", capsize=3, label=label)
        for x, text in notes:
            ax.annotate(text, (x, 22), fontsize=7, rotation=90, va="bottom", ha="center")
    bounds = results["bounds"]
    lines = [(bounds["centralized"], ":", "k", "centralized bound"),
             (bounds["local_iid"], "-.", "grey", "Local-IID bound")]
    lines += [(y, ls, "grey", name)
              for (name, y), ls in zip(locals_.items(), ("--", (0, (1, 3))), strict=False)]
    for y, ls, c, name in lines:
        ax.axhline(100 * y, ls=ls, c=c, lw=1, label=f"{name} {100 * y:.1f} %")
    ax.set_xticks(range(len(BUDGETS)), [f"ε = {b}" for b in BUDGETS])
    ax.set_xlabel("privacy budget per device (δ = 1e-5)")
    ax.set_ylabel("final test accuracy (%)")
    ax.set_ylim(0, 100)
    ax.set_title("Fashion-MNIST Dir(0.5), 16 rounds, 3 seeds: DP-FedAvg on 1,000 devices, "
                 "the others on 10", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    fig.tight_layout()
    out = HERE / "epsilon.png"
    fig.savefig(out, dpi=120)
    return out


if __name__ == "__main__":
    print(main())
