"""``edgefl export``: trained models of a run (or one model file) → ONNX, optionally int8."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from edgefl.cli.common import DATASET_HELP, DataDir, print_export
from edgefl.errors import ConfigError
from edgefl.report.console import Feedback, err


def export(
    out: Path = typer.Option(..., help="Output .onnx file (one model) or directory."),
    run: Path = typer.Option(None, help="Run directory written by a simulation."),
    device: str = typer.Option(None, help="Export this device's model."),
    tier: str = typer.Option(
        None, help="Export one model of this tier (the first device holding it)."
    ),
    all_devices: bool = typer.Option(False, "--all", help="Export every device's model."),
    checkpoint: Path = typer.Option(
        None,
        help="A model file (.safetensors with edgefl spec metadata) instead of --run.",
    ),
    dataset: str = typer.Option(
        None,
        help="Dataset of a --checkpoint when its metadata names none. " + DATASET_HELP,
    ),
    data_dir: DataDir = None,
    opset: int = typer.Option(17, help="ONNX opset."),
    quantize: str = typer.Option(None, help="Also write a static int8 model (int8)."),
    int8_format: str = typer.Option(
        "qdq",
        help="qdq (for TensorRT/CUDA and CPU) or qoperator (smaller, CPU only).",
    ),
    calibration_samples: int = typer.Option(
        256,
        help="Training samples for int8 calibration (and static BatchNorm).",
    ),
    test_samples: int = typer.Option(
        None, help="Test samples for the accuracy report (default all; 0 skips)."
    ),
    tolerance: float = typer.Option(
        1e-4, help="Parity tolerance, relative to max(1, max |logit|)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the reports as JSON on stdout."),
    workers: int = typer.Option(
        None,
        "--workers",
        help="Processes exporting models of a --run at once (default: one per core, from 4 "
        "models each; 1: none).",
    ),
) -> None:
    """Export trained models to ONNX (checked, parity-verified against PyTorch), optionally int8."""
    from edgefl.runtime.export_workers import export_context

    context = None
    if run is not None and all_devices and device is None and tier is None:
        context = export_context(run, data_dir, workers)
    from edgefl.export.run import export_checkpoint, export_run

    if (run is None) == (checkpoint is None):
        raise ConfigError("give exactly one of --run DIR or --checkpoint FILE")
    options = {
        "opset": opset,
        "quantize": quantize,
        "int8_format": int8_format,
        "calibration_samples": calibration_samples,
        "test_samples": test_samples,
        "tolerance": tolerance,
    }
    if run is not None:
        with Feedback(err, quiet=as_json) as feedback:
            results = export_run(
                run,
                out,
                device=device,
                tier=tier,
                all_devices=all_devices,
                data_dir=data_dir,
                on_progress=feedback.progress_hook,
                workers=workers,
                context=context,
                **options,
            )
    else:
        if device is not None or tier is not None or all_devices:
            raise ConfigError(
                "--device/--tier/--all choose models of a --run, not of a --checkpoint"
            )
        results = export_checkpoint(checkpoint, out, dataset=dataset, data_dir=data_dir, **options)
    if as_json:
        typer.echo(json.dumps(results))
        return
    for r in results:
        print_export(r)
