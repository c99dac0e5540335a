"""The inference benchmark's page: ``results.md`` and the latency figure, written from the result
that ``run.py`` measured."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_markdown(path: Path, result: dict) -> None:
    rows = result["rows"]
    cfg = result["config"]
    lines = [
        "# Inference benchmark: PyTorch eager vs ONNX Runtime fp32 vs static int8",
        "",
        f"Command: `{result['command']}`",
        "",
        f"Machine: {result['machine_before']['cpu']}, {result['machine_before']['cores']} cores, "
        f"load average (1/5/15 min) {result['machine_before']['loadavg_1_5_15']} before and "
        f"{result['machine_after']['loadavg_1_5_15']} after — shared with other jobs, so absolute "
        "times "
        "are noisy; all engines were measured interleaved call by call and the ratios compare them "
        "under the same load.",
        "",
        f"Setting: Fashion-MNIST (1×28×28); each model trained {cfg['epochs']} epoch(s) with Adam "
        f"(lr {cfg['lr']}, batch 64) on {cfg['train_samples']} training images; accuracy on "
        f"the first {cfg['test_samples']} test images (all engines); ResNet/hierarchy width "
        f"{cfg['width']}, CNN width {cfg['cnn_width']}; "
        f"batch-1 latency = median of {cfg['runs']} runs per engine after {cfg['warmup']} warm-up, "
        "PyTorch eager at 2 and 1 threads, ORT fp32 at 2 and 1 threads, ORT int8 (QDQ and "
        "QOperator) at 2 threads, all six interleaved "
        "(OMP_WAIT_POLICY=PASSIVE, ORT spinning off); training and eager accuracy with "
        f"{cfg['train_threads']} torch thread(s); int8 = static QDQ, per-channel int8 weights, "
        "uint8 activations, "
        f"MinMax calibration on {cfg['calibration_samples']} training images; ONNX opset 17.",
        "",
        "Latency columns: median ms at batch 1 (2t = 2 threads, 1t = 1 thread). Speed-up (spec) = "
        "eager 2t / "
        "ORT fp32 2t, as the issue defines it; speed-up (best) = the better eager setting / the "
        "better ORT "
        "setting, which removes the penalty a crowded machine puts on 2-thread PyTorch.",
        "",
        "| model | params | eager 2t | eager 1t | ORT fp32 2t | ORT fp32 1t | ORT int8 2t | fp32 "
        "speed-up (spec) | fp32 speed-up (best) | int8 vs fp32 | fp32 KiB | int8 KiB | int8/fp32 "
        "size | int8/fp32 weights | acc eager | acc ORT fp32 | acc ORT int8 | int8 Δ points | "
        "parity max abs diff |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        "---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lat = {k: v["median_ms"] for k, v in r["latency"].items()}
        lines.append(
            f"| {r['model']} | {r['parameters']:,} | {lat['eager_2t']:.2f} | "
            f"{lat['eager_1t']:.2f} | "
            f"{lat['ort_fp32_2t']:.2f} | {lat['ort_fp32_1t']:.2f} | {lat['ort_int8_2t']:.2f} | "
            f"{r['speedup_fp32_vs_eager']:.1f}× | {r['speedup_fp32_vs_eager_best']:.1f}× | "
            f"{r['speedup_int8_vs_fp32']:.2f}× | "
            f"{r['size_fp32_bytes'] / 1024:.0f} | {r['size_int8_bytes'] / 1024:.0f} | "
            f"{r['size_ratio_int8']:.2f} | "
            f"{r['weight_bytes_int8'] / r['weight_bytes_fp32']:.2f} | "
            f"{100 * r['accuracy_eager']:.2f} | {100 * r['accuracy_ort_fp32']:.2f} | "
            f"{100 * r['accuracy_ort_int8']:.2f} | "
            f"{-r['accuracy_drop_int8_points']:+.2f} | {r['parity_max_abs_diff']:.1e} |"
        )
    lines += [
        "",
        "### int8 file formats",
        "",
        "QDQ (the default, `edgefl export --quantize int8`) as shipped (compacted: short tensor "
        "ids, no shape "
        "annotations, no node names), the same QDQ graph as ORT's quantizer writes it, and "
        "QOperator "
        "(`--int8-format qoperator`, compacted; CPU execution provider only). Sizes relative to "
        "the fp32 file as exported.",
        "",
        "| model | params | fp32 KiB | QDQ KiB | QDQ/fp32 | QDQ uncompacted/fp32 | QOperator KiB "
        "| QOperator/fp32 | QOperator 2t ms | QOperator vs fp32 speed | acc QOperator | QOperator "
        "Δ points |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "size_int8_qoperator_bytes" not in r:
            continue
        lines.append(
            f"| {r['model']} | {r['parameters']:,} | {r['size_fp32_bytes'] / 1024:.0f} | "
            f"{r['size_int8_bytes'] / 1024:.0f} | "
            f"{r['size_ratio_int8']:.3f} | "
            f"{r['size_int8_uncompacted_bytes'] / r['size_fp32_bytes']:.3f} | "
            f"{r['size_int8_qoperator_bytes'] / 1024:.0f} | {r['size_ratio_int8_qoperator']:.3f} | "
            f"{r['latency']['ort_int8q_2t']['median_ms']:.2f} | "
            f"{r['speedup_int8_qoperator_vs_fp32']:.2f}× | "
            f"{100 * r['accuracy_ort_int8_qoperator']:.2f} | "
            f"{-r['accuracy_drop_int8_qoperator_points']:+.2f} |"
        )
    t = result["targets"]
    lines += [
        "",
        "## Targets",
        "",
        "- ORT fp32 ≥ 2× faster than eager at batch 1, both at 2 threads (spec): "
        f"**{t['fp32_2x_faster_than_eager']['held']}/{len(rows)} models** "
        f"(min speed-up {t['fp32_2x_faster_than_eager']['min']:.2f}×, median "
        f"{t['fp32_2x_faster_than_eager']['median']:.2f}×)"
        + (
            f"; misses: {', '.join(t['fp32_2x_faster_than_eager']['misses'])}"
            if t["fp32_2x_faster_than_eager"]["misses"]
            else ""
        ),
        "- the same, each engine at its better thread count (conservative): "
        f"**{t['fp32_2x_faster_than_eager_best']['held']}/{len(rows)} models** "
        f"(min speed-up {t['fp32_2x_faster_than_eager_best']['min']:.2f}×, median "
        f"{t['fp32_2x_faster_than_eager_best']['median']:.2f}×)"
        + (
            f"; misses: {', '.join(t['fp32_2x_faster_than_eager_best']['misses'])}"
            if t["fp32_2x_faster_than_eager_best"]["misses"]
            else ""
        ),
        "- static int8 ≤ 0.3× the fp32 file size: "
        f"**{t['int8_size_at_most_0.3x']['held']}/{len(rows)} models** "
        f"(max ratio {t['int8_size_at_most_0.3x']['max']:.3f}; the int8/fp32 weights column shows "
        "the weights alone — "
        "the rest is graph structure, whose share grows as models shrink)"
        + (
            f"; misses: {', '.join(t['int8_size_at_most_0.3x']['misses'])}"
            if t["int8_size_at_most_0.3x"]["misses"]
            else ""
        ),
        "- static int8 loses ≤ 0.5 accuracy points: "
        f"**{t['int8_accuracy_loss_at_most_0.5_points']['held']}/{len(rows)} models** "
        f"(largest loss {t['int8_accuracy_loss_at_most_0.5_points']['max']:.2f} points)"
        + (
            f"; misses: {', '.join(t['int8_accuracy_loss_at_most_0.5_points']['misses'])}"
            if t["int8_accuracy_loss_at_most_0.5_points"]["misses"]
            else ""
        ),
        *(
            [
                "- QOperator int8 ≤ 0.3× the fp32 file size: "
                f"**{t['int8_qoperator_size_at_most_0.3x']['held']}/{len(rows)} models** "
                f"(max ratio {t['int8_qoperator_size_at_most_0.3x']['max']:.3f})"
                + (
                    f"; misses: {', '.join(t['int8_qoperator_size_at_most_0.3x']['misses'])}"
                    if t["int8_qoperator_size_at_most_0.3x"]["misses"]
                    else ""
                ),
                "- QOperator int8 loses ≤ 0.5 accuracy points: "
                f"**{t['int8_qoperator_accuracy_loss_at_most_0.5_points']['held']}/{len(rows)} "
                "models** "
                f"(largest loss {t['int8_qoperator_accuracy_loss_at_most_0.5_points']['max']:.2f} "
                "points)",
            ]
            if "int8_qoperator_size_at_most_0.3x" in t
            else []
        ),
        "",
        "int8 vs fp32 latency (ORT, batch 1): median speed-up "
        f"{np.median([r['speedup_int8_vs_fp32'] for r in rows]):.2f}× "
        "(range "
        f"{min(r['speedup_int8_vs_fp32'] for r in rows):.2f}–"
        f"{max(r['speedup_int8_vs_fp32'] for r in rows):.2f}×).",
        "",
        "hierarchy-width models train with static BatchNorm (batch statistics); the export freezes "
        "population statistics from the calibration images, and every engine runs that frozen "
        "model. "
        "Accuracy of the static model itself (batches of 1000): "
        + ", ".join(
            f"{r['model']} {100 * r['eager_static_accuracy']:.2f}%"
            for r in rows
            if r["eager_static_accuracy"] is not None
        )
        + ".",
        "",
        f"Total wall time {result['wall_seconds'] / 60:.1f} min. Plot: latency.png.",
        "",
    ]
    if result["size_sweep"]:
        lines += [
            "## File size at wider widths (untrained weights; size only)",
            "",
            "| model | params | fp32 KiB | QDQ int8 KiB | QDQ/fp32 | QOperator KiB | "
            "QOperator/fp32 |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {r['model']} | {r['parameters']:,} | {r['size_fp32_bytes'] / 1024:.0f} | "
            f"{r['size_int8_bytes'] / 1024:.0f} | "
            f"{r['size_ratio_int8']:.3f} | "
            + (
                f"{r['size_int8_qoperator_bytes'] / 1024:.0f} | "
                f"{r['size_ratio_int8_qoperator']:.3f} |"
                if "size_int8_qoperator_bytes" in r
                else "– | – |"
            )
            for r in result["size_sweep"]
        ]
        lines.append("")
    path.write_text("\n".join(lines))


def plot(path: Path, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["model"] for r in rows]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(8, 0.6 * len(rows)), 4.5))
    engines = [("eager_2t", "PyTorch eager, 2 threads"), ("eager_1t", "PyTorch eager, 1 thread"),
               ("ort_fp32_2t", "ORT fp32, 2 threads"), ("ort_int8_2t", "ORT int8, 2 threads")]
    for k, (engine, label) in enumerate(engines):
        ax.bar(
            x + (k - 1.5) * 0.2, [r["latency"][engine]["median_ms"] for r in rows], 0.2, label=label
        )
    ax.set_yscale("log")
    ax.set_ylabel("batch-1 latency, median (ms)")
    ax.set_xticks(x, names, rotation=60, ha="right", fontsize=7)
    ax.legend()
    ax.set_title("Batch-1 latency on Fashion-MNIST models (engines interleaved call by call)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
