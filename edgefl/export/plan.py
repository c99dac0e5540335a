"""How ``edgefl export`` shares a run's models among processes. Torch-free, so that the command
can start the export workers' fork server before it imports torch itself: the two imports then
run side by side."""

from __future__ import annotations

import os

from edgefl.errors import ConfigError

#: an export worker costs a process start (torch's import: seconds): by default one is started
#: per core, and for at least this many models each
MODELS_PER_WORKER = 4

#: What an export worker runs, imported once by the fork server it is forked from (ONNX and ONNX
#: Runtime are imported by the export's functions, not by its modules: named here).
EXPORT_PRELOAD = [
    "edgefl.cli.main",  # first: it sets OMP_WAIT_POLICY before torch is imported
    "torch",
    "torch.onnx",
    "onnx",
    "onnxruntime",
    "onnxruntime.quantization",
    "edgefl.data.datasets",
    "edgefl.export.run",
    "edgefl.export.onnx_export",
    "edgefl.export.quantize",
    "edgefl.inference",
]


def export_workers(models: int, workers: int | None) -> int:
    """Processes that export ``models`` models at once: ``workers`` (at most one per model), by
    default one per core and at most one per :data:`MODELS_PER_WORKER` models; 1: no worker, the
    models are exported in the calling process."""
    if workers is not None and workers < 1:
        raise ConfigError(f"--workers must be positive, got {workers}")
    cores = os.cpu_count() or 1
    return min(models, workers or min(cores, models // MODELS_PER_WORKER)) or 1
