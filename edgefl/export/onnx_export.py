"""Export an EdgeModel to one self-contained ONNX file and prove it computes the same thing.

    report = export_model(model, "d03.onnx", class_names=info.class_names, parity_images=x_test)
    report.parity        # {1: 2.4e-07, 7: 3.1e-07}: max |ONNX − PyTorch| of the logits
                         # per batch size

The graph has one input `images` [batch, C, H, W] (float32 pixels in [0, 1], dynamic batch) and
one output `logits` [batch, num_classes]; all weights live inside the file. Normalisation with
the spec's mean/std is part of the graph, so a device only scales pixels to [0, 1]. The ONNX
`metadata_props` carry (see `edgefl.inference` for the reader):

    edgefl.format          "edgefl-onnx/1"
    edgefl.spec            the ModelSpec JSON (`ModelSpec.to_dict`)
    edgefl.class_names     JSON list of class names
    edgefl.preprocessing   JSON: input/output names, layout NCHW, float32, input_shape [C, H, W],
                           pixel_range [0, 1], normalization "inside_model", mean, std
    edgefl.batch_norm      "none", "running", or "frozen from N calibration images" (below)
    edgefl.quantization    "none" (or the int8 scheme, written by `quantize_int8`)
    + any `metadata` the caller adds (device id, run, dataset …)

Export uses PyTorch's TorchScript-based exporter (`dynamo=False`): it handles every family of
the zoo with torch 2.x and needs no onnxscript; in eval mode it folds BatchNorm into the convs.

**Batch-dependent BatchNorm.** hierarchy-width models default to static BatchNorm
(`bn=static`, HeteroFL's sBN), which normalises with the statistics of the *current batch* even
in eval mode: outputs depend on the other images in the batch, which no fixed graph can
reproduce (and batch-1 inference degenerates). `export_model` therefore refuses such a model
unless `calibration_images` are given; with them it freezes the statistics first — a copy of
the model gets ordinary BatchNorm whose running mean/var are the population statistics of the
calibration images (cumulative average, as HeteroFL's post-training sBN query and
`torch.optim.swa_utils.update_bn`) — and exports that copy. Parity is then checked against the
frozen copy. Models trained with `bn=running` need nothing of this.

Parity: the exported file passes `onnx.checker` and ONNX Runtime's logits are compared with
PyTorch's on `parity_images` (real test samples; uniform noise when none are given) at each of
`batch_sizes`; the export fails with `ExportError` when the max abs difference exceeds
`tolerance × max(1, max |logit|)`.
"""

from __future__ import annotations

import copy
import io
import json
import logging
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from edgefl.export.errors import ExportError
from edgefl.inference import (
    META_CLASS_NAMES,
    META_FORMAT,
    META_PREPROCESSING,
    META_QUANTIZATION,
    META_SPEC,
    ONNX_FORMAT,
    open_session,
)
from edgefl.models import EdgeModel, ModelSpec

log = logging.getLogger(__name__)

INPUT_NAME = "images"
OUTPUT_NAME = "logits"
META_BATCH_NORM = "edgefl.batch_norm"
DEFAULT_OPSET = 17
DEFAULT_TOLERANCE = 1e-4
DEFAULT_BATCH_SIZES = (1, 7)


@dataclass
class ExportReport:
    """What an export produced and how closely it matches PyTorch."""

    path: Path
    spec: ModelSpec
    opset: int
    size_bytes: int
    parity: dict[int, float]  # batch size → max |ONNX − PyTorch| over the parity images
    tolerance: float
    parity_data: str  # "given" (real samples) or "uniform noise"
    batch_norm: str
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def max_abs_diff(self) -> float:
        return max(self.parity.values(), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "model": self.spec.name,
            "spec": self.spec.to_dict(),
            "opset": self.opset,
            "size_bytes": self.size_bytes,
            "parity_max_abs_diff": {str(k): v for k, v in self.parity.items()},
            "tolerance": self.tolerance,
            "parity_data": self.parity_data,
            "batch_norm": self.batch_norm,
        }


# --- batch statistics ---------------------------------------------------------------------------


def _batch_stat_norms(model: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    return [
        m
        for m in model.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is None
    ]


def uses_batch_statistics(model: nn.Module) -> bool:
    """True when some BatchNorm normalises with the current batch's statistics in eval mode."""
    return bool(_batch_stat_norms(model))


@torch.no_grad()
def freeze_batch_statistics(
    model: nn.Module, images: torch.Tensor, batch_size: int = 256
) -> nn.Module:
    """A copy of `model` whose batch-statistics BatchNorms hold the population statistics of
    `images` as running statistics (eval mode). The original model is left untouched."""
    if len(images) == 0:
        raise ExportError("freezing BatchNorm statistics needs at least one calibration image")
    frozen = copy.deepcopy(model).eval()
    norms = _batch_stat_norms(frozen)
    for bn in norms:
        bn.track_running_stats = True
        bn.momentum = None  # cumulative average over all calibration batches
        bn.register_buffer("running_mean", torch.zeros(bn.num_features))
        bn.register_buffer("running_var", torch.ones(bn.num_features))
        bn.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))
        bn.train()  # only the norms: dropout and the rest stay in eval mode
    for start in range(0, len(images), batch_size):
        frozen(images[start : start + batch_size].float())
    return frozen.eval()


# --- export -------------------------------------------------------------------------------------


def preprocessing_metadata(spec: ModelSpec) -> dict[str, Any]:
    return {
        "input_name": INPUT_NAME,
        "output_name": OUTPUT_NAME,
        "layout": "NCHW",
        "dtype": "float32",
        "input_shape": list(spec.in_shape),
        "pixel_range": [0.0, 1.0],
        "uint8_scale": 1.0 / 255.0,
        "normalization": "inside_model",
        "mean": list(spec.mean),
        "std": list(spec.std),
    }


def onnx_bytes(model: nn.Module, in_shape: Sequence[int], opset: int = DEFAULT_OPSET) -> bytes:
    """The serialized ONNX graph of `model` (eval mode) with a dynamic batch dimension."""
    was_training = model.training
    model.eval()
    buffer = io.BytesIO()
    example = torch.rand(1, *in_shape)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            # The legacy exporter announces its deprecation on every call; it is chosen on purpose
            # (see the module docstring).
            warnings.simplefilter("ignore", category=DeprecationWarning)
            warnings.simplefilter("ignore", category=FutureWarning)
            warnings.simplefilter("ignore", category=UserWarning)
            torch.onnx.export(
                model,
                (example,),
                buffer,
                dynamo=False,
                opset_version=opset,
                input_names=[INPUT_NAME],
                output_names=[OUTPUT_NAME],
                dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
                do_constant_folding=True,
            )
    except Exception as exc:
        name = getattr(getattr(model, "spec", None), "name", type(model).__name__)
        raise ExportError(f"PyTorch could not export {name} to ONNX opset {opset}: {exc}") from exc
    finally:
        model.train(was_training)
    return buffer.getvalue()


def set_metadata(proto: Any, metadata: Mapping[str, str]) -> None:
    """Set (replace) `metadata_props` entries of an ONNX ModelProto."""
    keep = [(p.key, p.value) for p in proto.metadata_props if p.key not in metadata]
    del proto.metadata_props[:]
    for key, value in [*keep, *metadata.items()]:
        entry = proto.metadata_props.add()
        entry.key, entry.value = str(key), str(value)


def read_metadata(path: str | Path) -> dict[str, str]:
    """The `metadata_props` of an ONNX file as a dict."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    return {p.key: p.value for p in proto.metadata_props}


def check_parity(
    model: nn.Module,
    onnx_model: str | Path | bytes,
    images: torch.Tensor,
    *,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    tolerance: float = DEFAULT_TOLERANCE,
    threads: int | None = None,
) -> dict[int, float]:
    """Max |ONNX Runtime − PyTorch| of the logits for each batch size (whole batches of
    `images`, at most 8 per size); raises `ExportError` above `tolerance × max(1, max |logit|)`.
    `threads`: ONNX Runtime's intra-op threads (None: its default)."""
    session = open_session(onnx_model, threads=threads, providers=["CPUExecutionProvider"])
    was_training = model.training
    model.eval()
    result: dict[int, float] = {}
    try:
        for bs in batch_sizes:
            if len(images) < bs:
                raise ExportError(f"parity at batch size {bs} needs {bs} images, got {len(images)}")
            worst, scale = 0.0, 1.0
            for start in range(0, min(len(images) - bs, 7 * bs) + 1, bs):
                x = images[start : start + bs].float()
                with torch.no_grad():
                    expected = model(x).numpy()
                got = session.run([OUTPUT_NAME], {INPUT_NAME: x.numpy()})[0]
                if got.shape != expected.shape:
                    raise ExportError(f"ONNX output shape {got.shape} != PyTorch {expected.shape}")
                worst = max(worst, float(np.abs(got - expected).max()))
                scale = max(scale, float(np.abs(expected).max()))
            result[bs] = worst
            if not worst <= tolerance * scale:  # also catches NaN
                onednn = _onednn_disagrees(model, session, images[:bs].float(), tolerance * scale)
                if onednn is not None:
                    raise ExportError(
                        "PyTorch computes this model wrongly on this CPU: with oneDNN its logits "
                        "differ "
                        f"by {onednn[0]:.3g} from its own reference kernels (oneDNN off), which "
                        "ONNX Runtime "
                        f"matches within {onednn[1]:.2g}. The ONNX file would be faithful to the "
                        "weights, but "
                        "training here ran on the same kernels. Seen with torch 2.14.1 on CPUs "
                        "with 512-bit "
                        f"SVE (A64FX, QEMU's 'max'), not with torch 2.9.1 nor at 128/256-bit SVE "
                        f"(benchmarks/pi/results.md): install another torch, or turn oneDNN off "
                        f"(torch.backends.mkldnn.enabled = False) for training and export"
                    )
                raise ExportError(
                    f"ONNX Runtime differs from PyTorch by {worst:.3g} at batch size {bs} "
                    f"(tolerance {tolerance:g} × {scale:.3g}); the export is not faithful"
                )
    finally:
        model.train(was_training)
    return result


def _onednn_disagrees(
    model: nn.Module, session: Any, x: torch.Tensor, allowed: float
) -> tuple[float, float] | None:
    """(PyTorch with vs without oneDNN, ONNX Runtime vs PyTorch without oneDNN) when the parity
    failure is PyTorch's oneDNN kernels disagreeing with its reference kernels while ONNX Runtime
    agrees with the latter; None when oneDNN is not the difference (or is off already)."""
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return None
    with torch.no_grad():
        with_onednn = model(x).numpy()
        with torch.backends.mkldnn.flags(enabled=False):
            reference = model(x).numpy()
    got = session.run([OUTPUT_NAME], {INPUT_NAME: x.numpy()})[0]
    between = float(np.abs(with_onednn - reference).max())
    ort_vs_reference = float(np.abs(got - reference).max())
    if ort_vs_reference <= allowed < between:
        return between, ort_vs_reference
    return None


def export_model(
    model: EdgeModel,
    path: str | Path,
    *,
    opset: int = DEFAULT_OPSET,
    class_names: Sequence[str] | None = None,
    parity_images: torch.Tensor | None = None,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    tolerance: float = DEFAULT_TOLERANCE,
    calibration_images: torch.Tensor | None = None,
    metadata: Mapping[str, str] | None = None,
    threads: int | None = None,
) -> ExportReport:
    """Export `model` to the ONNX file `path`; check it and verify parity with PyTorch.

    - `class_names`: stored in the metadata (default "0".."K-1").
    - `parity_images`: float [N, C, H, W] in [0, 1], ideally real test samples; N ≥
      max(batch_sizes).
    - `calibration_images`: needed only for models with batch-statistics BatchNorm (see module doc).
    - `metadata`: extra string entries for `metadata_props`.
    - `threads`: ONNX Runtime's intra-op threads for the parity check (None: its default).
    The model itself is not modified. Returns an `ExportReport`; raises `ExportError`.
    """
    import onnx

    spec = getattr(model, "spec", None)
    if not isinstance(spec, ModelSpec):
        raise ExportError("export_model needs an EdgeModel (a model with a ModelSpec)")
    names = (
        [str(n) for n in class_names]
        if class_names is not None
        else [str(i) for i in range(spec.num_classes)]
    )
    if len(names) != spec.num_classes:
        raise ExportError(f"{len(names)} class names for a model of {spec.num_classes} classes")

    batch_norm = (
        "running"
        if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
        else "none"
    )
    if uses_batch_statistics(model):
        if calibration_images is None:
            raise ExportError(
                f"{spec.name} normalises with the statistics of each batch even in eval mode "
                "(static BatchNorm, hierarchy-width's default bn=static), so a fixed ONNX graph "
                "cannot reproduce it. Give calibration images (training samples; `edgefl export` "
                "does this itself) to freeze population statistics, or train with bn=running."
            )
        model = freeze_batch_statistics(model, calibration_images)
        batch_norm = f"frozen from {len(calibration_images)} calibration images"
        log.info("%s: static BatchNorm frozen to running statistics (%s)", spec.name, batch_norm)

    proto = onnx.load_from_string(onnx_bytes(model, spec.in_shape, opset))
    proto.producer_name = "edgefl"
    proto.doc_string = (
        f"edgefl model {spec.name}: images [N, {', '.join(map(str, spec.in_shape))}] in [0, 1] -> "
        "logits"
    )
    entries = {
        META_FORMAT: ONNX_FORMAT,
        META_SPEC: json.dumps(spec.to_dict()),
        META_CLASS_NAMES: json.dumps(names),
        META_PREPROCESSING: json.dumps(preprocessing_metadata(spec)),
        META_BATCH_NORM: batch_norm,
        META_QUANTIZATION: "none",
        **{str(k): str(v) for k, v in (metadata or {}).items()},
    }
    set_metadata(proto, entries)
    try:
        onnx.checker.check_model(proto, full_check=True)
    except Exception as exc:  # onnx.checker.ValidationError, shape inference errors
        raise ExportError(f"the exported graph of {spec.name} fails onnx.checker: {exc}") from None
    data = proto.SerializeToString()

    if parity_images is None:
        generator = torch.Generator().manual_seed(0)
        parity_images = torch.rand(max(batch_sizes) + 1, *spec.in_shape, generator=generator)
        parity_data = "uniform noise"
    else:
        parity_data = "given"
    parity = check_parity(model, data, parity_images, batch_sizes=batch_sizes, tolerance=tolerance,
                          threads=threads)

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)  # weights inside: one file (models here are far below protobuf's 2 GB)
    return ExportReport(
        path=path,
        spec=spec,
        opset=opset,
        size_bytes=len(data),
        parity=parity,
        tolerance=tolerance,
        parity_data=parity_data,
        batch_norm=batch_norm,
        metadata=entries,
    )
