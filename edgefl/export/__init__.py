"""ONNX export, parity check and int8 quantization of edgefl models; model files.

    from edgefl.export import export_model, quantize_int8, load_device_model
    model = load_device_model("runs/my-run", "d03")           # run_dir/models/d03.safetensors
    report = export_model(model, "d03.onnx", class_names=names, parity_images=x_test)
    quantize_int8("d03.onnx", "d03.int8.onnx", calibration_images=x_train[:256])

Run them with `edgefl.inference.Predictor`. Modules: `checkpoint` (safetensors model files),
`onnx_export` (export + metadata + parity, and how batch-statistics BatchNorm is handled),
`quantize` (static QDQ int8), `run` (what `edgefl export` does with a run directory),
`errors`. Names are imported lazily, so that `import edgefl.export.checkpoint` (used by the
simulation to save models) does not load onnx.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "ExportError": "errors",
    "ModelFileError": "errors",
    "InferenceError": "errors",
    "save_model_file": "checkpoint",
    "load_model_file": "checkpoint",
    "read_model_file": "checkpoint",
    "save_device_models": "checkpoint",
    "load_device_model": "checkpoint",
    "device_model_path": "checkpoint",
    "ExportReport": "onnx_export",
    "export_model": "onnx_export",
    "check_parity": "onnx_export",
    "read_metadata": "onnx_export",
    "freeze_batch_statistics": "onnx_export",
    "uses_batch_statistics": "onnx_export",
    "QuantizeReport": "quantize",
    "quantize_int8": "quantize",
    "export_run": "run",
    "export_checkpoint": "run",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module 'edgefl.export' has no attribute {name!r}")
    return getattr(importlib.import_module(f"edgefl.export.{_NAMES[name]}"), name)


def __dir__() -> list[str]:
    return __all__
