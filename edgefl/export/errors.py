"""Errors of export and inference (both are `EdgeflError`s, so the CLI prints one line).

    EdgeflError
    ├── ExportError        a model cannot be exported faithfully (parity above tolerance,
    │                      batch-dependent BatchNorm without calibration data …)
    ├── ModelFileError     a model file is missing, unreadable, or not a valid ONNX/edgefl file
    └── InferenceError     inputs that do not fit the model (wrong shape, dtype …); also a ValueError
"""

from __future__ import annotations

from edgefl.errors import EdgeflError


class ExportError(EdgeflError):
    """The model could not be exported faithfully."""


class ModelFileError(EdgeflError):
    """A model file is missing, unreadable, or not what it claims to be."""


class InferenceError(EdgeflError, ValueError):
    """Inputs that the model cannot take."""
