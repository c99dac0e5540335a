"""The runner's figures (../shared/specs/BENCHMARKS.md, "What a benchmark writes"): accuracy per
round with a band over seeds, per method and setting, and accuracy against bytes."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.claims import mean_sd


def band_panel(
    ax,
    runs: Sequence[Mapping[str, Any]],
    value: Callable[[Mapping[str, Any]], float | None],
    bounds: Mapping[str, float | None],
    title: str,
    ylabel: str,
    *,
    lw: float = 1.4,
    fontsize: int = 10,
    legend_size: int = 7,
) -> None:
    """One panel of curves per round: each method's mean over its runs (``value`` of a per-round
    entry, a fraction) with a band of ± 1 sd, and each bound as a dashed line; in %, 0 to 100."""
    import numpy as np

    for method in dict.fromkeys(r["method"] for r in runs):
        mr = [r for r in runs if r["method"] == method]
        xs = sorted({p["round"] for r in mr for p in r["per_round"] if value(p) is not None})
        curves = [
            [
                next(
                    (value(p) for p in r["per_round"] if p["round"] == x and value(p) is not None),
                    np.nan,
                )
                for x in xs
            ]
            for r in mr
        ]
        arr = 100 * np.array(curves, dtype=float)
        m, s = np.nanmean(arr, 0), np.nanstd(arr, 0)
        (line,) = ax.plot(xs, m, label=f"{method} (n={len(mr)})", lw=lw)
        ax.fill_between(xs, m - s, m + s, color=line.get_color(), alpha=0.18)
    for name, bound in bounds.items():
        if bound is not None and not (isinstance(bound, float) and math.isnan(bound)):
            ax.axhline(100 * bound, ls="--", lw=0.9, color="grey")
            ax.text(
                ax.get_xlim()[0], 100 * bound, f" {name}", fontsize=7, va="bottom", color="grey"
            )
    ax.set_title(title, fontsize=fontsize)
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size, loc="lower right")


def plot_results(results: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """accuracy.png and accuracy_bytes.png, a panel per setting; none (and none left from an
    earlier report) where no run has finished (``--partial`` before a new profile's first cell)."""
    runs = results["runs"]
    settings = list(dict.fromkeys(r["setting"] for r in runs))
    if not settings:
        for name in ("accuracy.png", "accuracy_bytes.png"):
            (out_dir / name).unlink(missing_ok=True)
        return []

    def accuracy(ax, setting: str) -> None:
        rs = [r for r in runs if r["setting"] == setting]
        band_panel(ax, rs, lambda p: p.get("accuracy"), results.get("bounds", {}),
                   f"{results['benchmark']}: {setting}", "mean device test accuracy (%)")

    def accuracy_bytes(ax, setting: str) -> None:
        rs = [r for r in runs if r["setting"] == setting]
        for method in dict.fromkeys(r["method"] for r in rs):
            mr = [r for r in rs if r["method"] == method]
            b = statistics.fmean(r["bytes_up_per_device_round"] + r["bytes_down_per_device_round"]
                                 for r in mr)
            a, s = mean_sd([r["final_accuracy"] for r in mr])
            ax.errorbar([max(b, 1)], [100 * a], yerr=[100 * s], fmt="o", capsize=3, label=method)
        ax.set_xscale("log")
        ax.set_title(f"{results['benchmark']}: {setting}", fontsize=10)
        ax.set_xlabel("bytes per device-round, up + down (log)")
        ax.set_ylabel("final accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)

    return [
        setting_panels(settings, accuracy, "accuracy per round (mean ± sd over seeds)",
                       out_dir / "accuracy.png"),
        setting_panels(settings, accuracy_bytes, "accuracy vs traffic",
                       out_dir / "accuracy_bytes.png"),
    ]


def setting_panels(settings: Sequence[str], draw: Callable[[Any, str], None], title: str,
                   path: Path) -> Path:
    """A figure of one panel per setting (three a row at most), ``draw(ax, setting)`` filling
    each, saved to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(settings)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.8 * rows), squeeze=False)
    for ax, setting in zip(axes.flat, settings, strict=False):
        draw(ax, setting)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
