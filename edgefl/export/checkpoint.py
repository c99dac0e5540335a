"""Model files: one model's weights in one safetensors file, with its `ModelSpec` in the metadata.

    save_model_file(model, "d03.safetensors", dataset="fashion-mnist")
    model = load_model_file("d03.safetensors")            # an EdgeModel in eval mode
    model = load_device_model("runs/my-run", "d03")       # runs/my-run/models/d03.safetensors

A simulation writes one such file per device at the end of the run (`save_device_models`).
This is the "plain checkpoint file" `edgefl export --checkpoint` takes: safetensors only, so
loading one never runs code (no pickle, never `torch.load`). The file format itself lives in
`edgefl.models.files`; this module adds the run directory's layout.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from torch import nn

from edgefl.errors import ConfigError
from edgefl.export.errors import ModelFileError
from edgefl.models import EdgeModel, ModelSpec
from edgefl.models.files import FORMAT, load_model_file, read_model_file, save_model_file

__all__ = ["FORMAT", "MODELS_DIR", "device_model_path", "load_device_model", "load_model_file",
           "read_model_file", "save_device_models", "save_model_file"]

MODELS_DIR = "models"
_DEVICE_ID = re.compile(r"^[A-Za-z0-9_.-]+$")


def device_model_path(run_dir: str | Path, device_id: str) -> Path:
    if not _DEVICE_ID.match(device_id):
        raise ConfigError(f"invalid device id {device_id!r}")
    return Path(run_dir) / MODELS_DIR / f"{device_id}.safetensors"


def save_device_models(
    run_dir: str | Path,
    models: Mapping[str, nn.Module],
    *,
    specs: Mapping[str, ModelSpec] | None = None,
    dataset: str | None = None,
) -> list[Path]:
    """Write each device's model to run_dir/models/<device_id>.safetensors (`specs` default to
    the models' own)."""
    specs = specs or {}
    return [
        save_model_file(
            model, device_model_path(run_dir, device_id), spec=specs.get(device_id), dataset=dataset
        )
        for device_id, model in models.items()
    ]


def load_device_model(run_dir: str | Path, device_id: str) -> EdgeModel:
    """The final model of device `device_id` in a run directory (eval mode)."""
    path = device_model_path(run_dir, device_id)
    if not path.is_file():
        raise ModelFileError(
            f"run {run_dir} has no saved model for device {device_id!r} (expected {path}); "
            "runs save device models at the end (a fleet run: those its devices sent back at the "
            "finish)"
        )
    return load_model_file(path)
