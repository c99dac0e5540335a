"""Model files: one model's weights in one safetensors file, with its `ModelSpec` in the metadata.

    save_model_file(model, "d03.safetensors", dataset="fashion-mnist")
    model = load_model_file("d03.safetensors")            # an EdgeModel in eval mode

The format belongs to the models (a model and its spec, nothing about runs or export), so every
layer that needs a model from a file — export, a method's server (FedVTC's oracle) — reads it
from here. Safetensors only, so loading one never runs code (no pickle, never `torch.load`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save
from torch import nn

from edgefl.errors import ConfigError, ModelFileError
from edgefl.models import EdgeModel, ModelSpec, build_model

FORMAT = "edgefl-model/1"


def model_file_bytes(
    model: nn.Module, *, spec: ModelSpec | None = None, dataset: str | None = None
) -> bytes:
    """The bytes of :func:`save_model_file`'s file (for a process that cannot write the run's
    directory itself, e.g. a Ray worker on another machine)."""
    spec = spec or getattr(model, "spec", None)
    if not isinstance(spec, ModelSpec):
        raise ConfigError("save_model_file needs an EdgeModel or an explicit spec")
    # Copies, so that tensors sharing storage (tied weights, views) are stored independently.
    tensors = {
        name: t.detach().cpu().contiguous().clone() for name, t in model.state_dict().items()
    }
    meta = {"format": FORMAT, "spec": json.dumps(spec.to_dict())}
    if dataset:
        meta["dataset"] = dataset
    return save(tensors, metadata=meta)


def save_model_file(
    model: nn.Module, path: str | Path, *, spec: ModelSpec | None = None, dataset: str | None = None
) -> Path:
    """Write `model`'s state dict to `path` (safetensors) with the spec JSON in the metadata.

    `spec` defaults to `model.spec` (every EdgeModel has one); `dataset` names the data the model
    was trained on, so that an export can find test samples and class names.
    """
    data = model_file_bytes(model, spec=spec, dataset=dataset)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def read_model_file(path: str | Path) -> tuple[ModelSpec, dict[str, torch.Tensor], dict[str, str]]:
    """The spec, the tensors and the raw metadata of a model file written by `save_model_file`."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"no model file at {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
            tensors = {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118 - safe_open API
    except (SafetensorError, OSError, ValueError) as exc:
        raise ModelFileError(f"{path} is not a readable safetensors file: {exc}") from None
    if meta.get("format") != FORMAT or "spec" not in meta:
        raise ModelFileError(
            f"{path} is a safetensors file but not an edgefl model file (no {FORMAT!r} spec "
            "metadata)"
        )
    try:
        spec = ModelSpec.from_dict(json.loads(meta["spec"]))
    except (json.JSONDecodeError, TypeError, ConfigError) as exc:
        raise ModelFileError(f"{path} holds an invalid model spec: {exc}") from None
    return spec, tensors, meta


def load_model_file(path: str | Path) -> EdgeModel:
    """Build the model a file describes and load its weights (strictly); returned in eval mode."""
    spec, tensors, _ = read_model_file(path)
    model = build_model(spec)
    try:
        model.load_state_dict(tensors, strict=True)
    except RuntimeError as exc:
        raise ModelFileError(
            f"the weights in {path} do not fit a {spec.name} model: {exc}"
        ) from None
    return model.eval()
