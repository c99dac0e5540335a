"""Plots of a run: accuracy per tier vs round, bytes per round."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: devices and CI have no display
import matplotlib.pyplot as plt  # noqa: E402

from edgefl.report.recorder import read_rounds  # noqa: E402


def plot_run(run_dir: Path) -> list[Path]:
    run_dir = Path(run_dir)
    rounds = read_rounds(run_dir)
    out = []
    evals = [(r["round"] + 1, r["eval"]) for r in rounds if "eval" in r]
    if evals:
        fig, ax = plt.subplots(figsize=(6, 4))
        tiers = sorted({t for _, e in evals for t in e["tier_accuracy"]})
        for tier in tiers:
            pts = [(x, e["tier_accuracy"][tier]) for x, e in evals if e["tier_accuracy"].get(tier) is not None]
            ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], marker="o", ms=3, label=f"tier {tier}")
        ax.set_xlabel("round")
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        out.append(run_dir / "accuracy.png")
        fig.savefig(out[-1], dpi=120)
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [r["round"] for r in rounds]
    ax.plot(xs, [r["bytes_up_total"] / 1e6 for r in rounds], label="uplink")
    ax.plot(xs, [r["bytes_down_total"] / 1e6 for r in rounds], label="downlink")
    ax.set_xlabel("round")
    ax.set_ylabel("MB per round")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out.append(run_dir / "bytes.png")
    fig.savefig(out[-1], dpi=120)
    plt.close(fig)
    return out
