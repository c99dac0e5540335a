"""Errors of export and inference (both are `EdgeflError`s, so the CLI prints one line).

    EdgeflError
    ├── ExportError        a model cannot be exported faithfully (parity above tolerance,
    │                      batch-dependent BatchNorm without calibration data …)
    ├── ModelFileError     a model file is missing, unreadable, or not a valid ONNX/edgefl file
    └── InferenceError     inputs that do not fit the model (wrong shape, dtype …); also a
                           ValueError
"""

from __future__ import annotations

from edgefl.errors import EdgeflError, InferenceError, ModelFileError

# inference (edgefl.inference, below export: it runs on devices without torch) raises the two
# latter; they live in edgefl.errors so that it needs nothing from this package
__all__ = ["ExportError", "InferenceError", "ModelFileError"]


class ExportError(EdgeflError):
    """The model could not be exported faithfully."""
