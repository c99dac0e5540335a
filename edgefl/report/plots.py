"""Plots of a run: accuracy per tier vs round (with the mean and a Local reference), bytes per
round."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: devices and CI have no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from edgefl.report.runfiles import read_rounds  # noqa: E402


def _measured(x) -> bool:
    return isinstance(x, (int, float)) and x == x  # None (not measured) and NaN are not points


def _accuracy_points(
    rounds: list[dict], summary: dict
) -> tuple[list[int], list[dict], list[float | None]]:
    """(x = rounds completed, from 1; per-tier accuracies; means): every per-round evaluation,
    then the final evaluation on the test split after the last completed round."""
    xs, tiers, means = [], [], []
    for r in rounds:
        if "eval" in r:
            xs.append(r["round"])
            tiers.append(r["eval"].get("tier_accuracy") or {})
            means.append(r["eval"].get("mean_accuracy"))
    if summary.get("tier_accuracy") and not summary.get("interrupted"):
        xs.append(summary.get("rounds_completed", summary["rounds"]))
        tiers.append(summary["tier_accuracy"])
        means.append(summary.get("mean_accuracy"))
    return xs, tiers, means


def _integer_rounds(ax) -> None:
    """Rounds are whole numbers, from 1: no tick at 0.5 or 1.5."""
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(left=0.5)


def plot_run(run_dir: Path) -> list[Path]:
    run_dir = Path(run_dir)
    rounds = [r for r in read_rounds(run_dir) if r.get("phase", "train") == "train"]
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    name = f"{summary.get('algorithm', 'run')} on {summary.get('dataset', '?')}"
    out = []
    xs, tiers, means = _accuracy_points(rounds, summary)
    if xs:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for tier in sorted({t for e in tiers for t in e}, key=lambda t: (len(t), t)):
            pts = [(x, e[tier]) for x, e in zip(xs, tiers, strict=True) if _measured(e.get(tier))]
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                marker="o",
                ms=2.5,
                lw=1,
                alpha=0.8,
                label=f"tier {tier}",
            )
        pts = [(x, m) for x, m in zip(xs, means, strict=True) if _measured(m)]
        ax.plot(
            [p[0] for p in pts],
            [p[1] for p in pts],
            color="black",
            lw=2.2,
            label="mean over devices",
        )
        local = summary.get("local_reference")
        if local:
            lx = [p["round"] for p in local.get("accuracy_per_round", [])]
            ly = [p["mean_accuracy"] for p in local.get("accuracy_per_round", [])]
            if lx and all(_measured(y) for y in ly):
                ax.plot(
                    lx,
                    ly,
                    color="grey",
                    ls="--",
                    lw=1.6,
                    label=f"Local, mean (final {100 * local['mean_accuracy']:.1f} %)",
                )
            else:
                ax.axhline(
                    local["mean_accuracy"], color="grey", ls="--", lw=1.6, label="Local, mean"
                )
        ax.set_title(f"{name}: test accuracy per depth tier", fontsize=10)
        ax.set_xlabel("round (evaluated after it)")
        ax.set_ylabel("accuracy (fraction of test images correct)")
        ax.set_ylim(0, 1)
        _integer_rounds(ax)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right", ncol=2)
        fig.tight_layout()
        out.append(run_dir / "accuracy.png")
        fig.savefig(out[-1], dpi=120)
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    bx = [r["round"] for r in rounds]
    for key, label in (("bytes_up_total", "uplink (devices → server)"),
                       ("bytes_down_total", "downlink (server → devices)")):
        ax.plot(bx, [r[key] / 1e6 for r in rounds], marker="o", ms=2.5, label=label)
    noted = _explain_alternation(ax, fig, rounds, bx)
    ax.set_title(f"{name}: traffic per round, all devices (evaluation included)", fontsize=10)
    ax.set_xlabel("round")
    ax.set_ylabel("MB per round (10⁶ bytes)")
    ax.set_ylim(bottom=0)
    _integer_rounds(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout(rect=(0, 0.04, 1, 1) if noted else None)
    out.append(run_dir / "bytes.png")
    fig.savefig(out[-1], dpi=120)
    plt.close(fig)
    return out


def _explain_alternation(ax, fig, rounds: list[dict], xs: list[int]) -> bool:
    """Say why traffic alternates between rounds: evaluated rounds also send the evaluation's
    downlinks, after which the next round's training downlinks are not re-sent (the devices hold
    them); Velo's CVAE rounds (the server trained its CVAE) are marked too. True when a note
    was written under the axes."""
    noted = False
    evaluated = [x for x, r in zip(xs, rounds, strict=True) if "eval" in r]
    if evaluated and len(evaluated) < len(rounds):
        for i, x in enumerate(evaluated):
            ax.axvspan(
                x - 0.5,
                x + 0.5,
                color="#8250df",
                alpha=0.08,
                lw=0,
                label="evaluation round" if i == 0 else None,
            )
        if any(r.get("downlinks_not_resent") for r in rounds):
            fig.text(
                0.01,
                0.01,
                "An evaluation round's downlink counts the evaluation's models too; the next "
                "round's training "
                "downlink is then not re-sent (the devices hold it).",
                fontsize=6.5,
                color="#59636e",
            )
            noted = True
    cvae = [x for x, r in zip(xs, rounds, strict=True) if "cvae_loss" in (r.get("server") or {})]
    if cvae:
        ax.plot(
            cvae,
            [0] * len(cvae),
            ls="none",
            marker="^",
            ms=7,
            color="#953800",
            clip_on=False,
            zorder=5,
            label="CVAE round (the server trained its CVAE)",
        )
    return noted
