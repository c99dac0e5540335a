"""ONNX Runtime inference on the device: `Predictor` runs an exported model.

    from edgefl.inference import Predictor
    p = Predictor("d03.onnx")                 # CPU, or CUDA/TensorRT when onnxruntime has them
    p.input_shape, p.class_names, p.spec      # from the ONNX metadata written by `export_model`
    classes = p.predict(images)               # images: [N, C, H, W] (or [C, H, W]) in [0, 1],
                                              # or uint8
    p.evaluate(load_dataset("fashion-mnist", "test"))   # {"accuracy": …, "samples": …,
                                                        #  "seconds": …}

Preprocessing is read from the metadata: the model normalises with its mean/std *inside* the
graph, so the only step outside is scaling pixels to [0, 1] (uint8 inputs are divided by 255).
An input whose shape differs from the model's is refused with an `InferenceError` naming both
shapes; a file that is not a valid ONNX model raises `ModelFileError`. ONNX files without
edgefl metadata also work: the input shape then comes from the graph and classes are numbered.

Labelled data is scored against the model's classes *by name* (:func:`class_index_map`): the
classes of a dataset or the folders of an image folder are matched to the class names the
export wrote into the model, and data whose classes the model does not know is refused with the
names that do not match, unless an explicit mapping is given. This module needs no torch.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgefl.errors import ConfigError, InferenceError, ModelFileError
from edgefl.models.spec import ModelSpec  # a dataclass: no torch

META_FORMAT = "edgefl.format"
META_SPEC = "edgefl.spec"
META_CLASS_NAMES = "edgefl.class_names"
META_PREPROCESSING = "edgefl.preprocessing"
META_QUANTIZATION = "edgefl.quantization"
ONNX_FORMAT = "edgefl-onnx/1"

# Preferred first; only those the installed onnxruntime offers are used.
PROVIDER_PREFERENCE = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")
PROVIDER_ALIASES = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
}


def resolve_providers(providers: Sequence[str] | None = None) -> list[str]:
    """Execution providers to use: the given ones (aliases cpu/cuda/tensorrt accepted), or every
    preferred one the installed onnxruntime has, best first."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    if providers is None:
        return [p for p in PROVIDER_PREFERENCE if p in available] or ["CPUExecutionProvider"]
    chosen = [PROVIDER_ALIASES.get(p.lower(), p) for p in providers]
    missing = [p for p in chosen if p not in available]
    if missing:
        raise InferenceError(
            f"execution provider(s) {', '.join(missing)} not available; this onnxruntime has: "
            f"{', '.join(available)}"
        )
    return chosen


def open_session(
    model: str | Path | bytes, *, threads: int | None = None, providers: Sequence[str] | None = None
):
    """An `onnxruntime.InferenceSession` for a file or serialized model; invalid models raise
    `ModelFileError` with one readable line."""
    import onnxruntime as ort

    where = "the model bytes" if isinstance(model, bytes) else str(model)
    if not isinstance(model, bytes):
        path = Path(model)
        if not path.is_file():
            raise ModelFileError(f"no ONNX model file at {path}")
        model = str(path)
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only; ORT's warnings would drown the CLI output
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    try:
        return ort.InferenceSession(
            model, sess_options=options, providers=resolve_providers(providers)
        )
    except InferenceError:
        raise
    except Exception as exc:  # onnxruntime raises its own pybind exception types
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelFileError(f"{where} is not a valid ONNX model: {reason}") from None


def _json_meta(meta: dict[str, str], key: str) -> Any:
    if key not in meta:
        return None
    try:
        return json.loads(meta[key])
    except json.JSONDecodeError:
        raise ModelFileError(f"ONNX metadata {key!r} is not valid JSON") from None


class Predictor:
    """An exported model, ready to classify images with ONNX Runtime.

    `threads` sets ONNX Runtime's intra-op threads (None = its default); `providers` picks
    execution providers (default: TensorRT, CUDA, CPU — those available).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        threads: int | None = None,
        providers: Sequence[str] | None = None,
    ):
        self.path = Path(path)
        self.session = open_session(self.path, threads=threads, providers=providers)
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        if len(inputs) != 1 or len(outputs) < 1:
            raise ModelFileError(
                f"{self.path} has {len(inputs)} inputs; a classifier takes one image tensor"
            )
        self.input_name = inputs[0].name
        self.output_name = outputs[0].name
        self.metadata: dict[str, str] = dict(self.session.get_modelmeta().custom_metadata_map)
        spec = _json_meta(self.metadata, META_SPEC)
        try:
            self.spec: ModelSpec | None = ModelSpec.from_dict(spec) if spec is not None else None
        except Exception as exc:
            raise ModelFileError(f"{self.path} carries an invalid model spec: {exc}") from None
        self.preprocessing: dict[str, Any] = _json_meta(self.metadata, META_PREPROCESSING) or {}
        self.input_shape = self._input_shape(inputs[0].shape)
        names = _json_meta(self.metadata, META_CLASS_NAMES)
        num_classes = self.spec.num_classes if self.spec else _last_dim(outputs[0].shape)
        if names is None and num_classes:
            names = [str(i) for i in range(num_classes)]
        self.class_names: list[str] = [str(n) for n in names or []]
        self.quantization = self.metadata.get(META_QUANTIZATION, "none")

    def _input_shape(self, graph_shape: list) -> tuple[int | None, ...]:
        """(C, H, W) the model takes; None for a dimension the graph leaves free."""
        if self.preprocessing.get("input_shape"):
            return tuple(int(v) for v in self.preprocessing["input_shape"])
        if self.spec is not None:
            return tuple(self.spec.in_shape)
        if len(graph_shape) != 4:
            raise ModelFileError(
                f"{self.path} takes a rank-{len(graph_shape)} input; expected images [N, C, H, W]"
            )
        return tuple(d if isinstance(d, int) else None for d in graph_shape[1:])

    @property
    def providers(self) -> list[str]:
        return list(self.session.get_providers())

    # --- inputs ---------------------------------------------------------------------------------

    def prepare(self, images: Any) -> np.ndarray:
        """float32 [N, C, H, W] in [0, 1] from an array or tensor; uint8 pixels are scaled by 1/255.
        Raises `InferenceError` when the shape does not fit the model."""
        if hasattr(images, "detach"):  # a torch tensor
            images = images.detach().cpu().numpy()
        x = np.asarray(images)
        if x.ndim == 3:
            x = x[None]
        expected = "[N, " + ", ".join("?" if d is None else str(d) for d in self.input_shape) + "]"
        if x.ndim != 4 or any(
            want is not None and got != want
            for got, want in zip(x.shape[1:], self.input_shape, strict=True)
        ):
            raise InferenceError(
                f"input of shape {list(x.shape)} does not fit the model, which takes {expected} "
                "(N images of channels × height × width, pixels in [0, 1])"
            )
        if x.dtype == np.uint8:
            return (x.astype(np.float32) / 255.0).astype(np.float32, copy=False)
        if not np.issubdtype(x.dtype, np.floating):
            raise InferenceError(f"images must be uint8 pixels or floats in [0, 1], got {x.dtype}")
        return np.ascontiguousarray(x, dtype=np.float32)

    def load_images(self, paths: Sequence[str | Path], *, resize: bool = False) -> np.ndarray:
        """Image files (PNG, JPEG … or .npy arrays [C, H, W]/[N, C, H, W]) as float32 [N, C, H, W].

        Pictures are converted to the model's channels (grey or RGB); a picture of another size
        is an `InferenceError` unless `resize` is set. `.npy` files are read with pickles disabled.
        """
        arrays = [self._load_one(Path(p), resize) for p in paths]
        if not arrays:
            raise InferenceError("no images given")
        return np.concatenate(arrays)

    def _load_one(self, path: Path, resize: bool) -> np.ndarray:
        if not path.is_file():
            raise InferenceError(f"no image file at {path}")
        if path.suffix.lower() == ".npy":
            try:
                array = np.load(path, allow_pickle=False)  # never unpickle an input file
            except (ValueError, OSError) as exc:
                raise InferenceError(f"{path} is not a readable .npy array: {exc}") from None
            try:
                return self.prepare(array)
            except InferenceError as exc:
                raise InferenceError(f"{path}: {exc}") from None
        from PIL import Image, UnidentifiedImageError

        channels, height, width = self.input_shape
        try:
            with Image.open(path) as img:
                img = img.convert("L" if channels == 1 else "RGB")
                if height is not None and width is not None and img.size != (width, height):
                    if not resize:
                        # in the CLI's words (the API's resize=True is the same)
                        raise InferenceError(
                            f"{path} is {img.size[0]}×{img.size[1]} pixels, but the model takes "
                            f"{width}×{height}: run edgefl infer with --resize to scale pictures "
                            "to it"
                        )
                    img = img.resize((width, height), Image.Resampling.BILINEAR)
                pixels = np.asarray(img, dtype=np.uint8)
        except (UnidentifiedImageError, OSError) as exc:
            raise InferenceError(f"{path} is not a readable image: {exc}") from None
        pixels = pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)
        if channels not in (None, 1, 3):
            raise InferenceError(f"the model takes {channels}-channel inputs; give .npy arrays")
        return self.prepare(pixels)

    # --- outputs --------------------------------------------------------------------------------

    def logits(self, images: Any, *, batch_size: int = 256) -> np.ndarray:
        """Logits [N, num_classes]."""
        x = self.prepare(images)
        if batch_size < 1:
            raise InferenceError(f"batch size must be positive, got {batch_size}")
        out = [
            self.session.run([self.output_name], {self.input_name: x[i : i + batch_size]})[0]
            for i in range(0, len(x), batch_size)
        ]
        return np.concatenate(out) if out else np.zeros((0, len(self.class_names)), np.float32)

    def probabilities(self, images: Any, *, batch_size: int = 256) -> np.ndarray:
        z = self.logits(images, batch_size=batch_size)
        z = np.exp(z - z.max(axis=1, keepdims=True))
        return z / z.sum(axis=1, keepdims=True)

    def predict(self, images: Any, *, batch_size: int = 256) -> np.ndarray:
        """Class indices [N]."""
        return self.logits(images, batch_size=batch_size).argmax(axis=1)

    def evaluate(
        self, dataset: Any, *, batch_size: int = 256, limit: int | None = None
    ) -> dict[str, float]:
        """Accuracy (0–1) on an `ArrayDataset` whose class order is the model's (its uint8 images
        go through the same preprocessing as any input); `limit` takes the first samples only."""
        return self.evaluate_arrays(
            dataset.x.numpy(), dataset.y.numpy(), batch_size=batch_size, limit=limit
        )

    def evaluate_arrays(
        self, x: np.ndarray, y: np.ndarray, *, batch_size: int = 256, limit: int | None = None
    ) -> dict[str, float]:
        """Accuracy (0–1) of images ``x`` against labels ``y`` numbered as the model's classes."""
        if limit is not None:
            x, y = x[:limit], y[:limit]
        t0 = time.perf_counter()
        predicted = self.predict(x, batch_size=batch_size)
        seconds = time.perf_counter() - t0
        return {
            "accuracy": float((predicted == y).mean()) if len(y) else 0.0,
            "samples": float(len(y)),
            "seconds": seconds,
        }


def _name_key(name: str) -> str:
    # "T-shirt/top" cannot be a folder name: compare names without case and punctuation
    return re.sub(r"[^0-9a-z]+", "", name.lower())


def class_index_map(
    data_classes: Sequence[str],
    model_classes: Sequence[str],
    mapping: Mapping[str, str] | None = None,
    *,
    skip_unknown: bool = False,
) -> tuple[np.ndarray, dict[str, str]]:
    """For each class of the data (a dataset's class names, an image folder's folder names), the
    index of the model's class of the same name, and {data class: model class}.

    Names match exactly, else by their slug: lower case, letters and digits only (a folder
    "t-shirt-top" or "T-shirt_top" is the class "T-shirt/top", which no folder can be named).
    ``mapping`` {data class: model class} decides where given. A data class that matches no model
    class raises `ConfigError` naming it, unless ``skip_unknown`` (then its index is -1 and it is
    left out of the returned mapping); two data classes that land on one model class raise too.
    """
    mapping = dict(mapping or {})
    exact = {name: i for i, name in enumerate(model_classes)}
    keys: dict[str, list[int]] = {}
    for i, name in enumerate(model_classes):
        keys.setdefault(_name_key(name), []).append(i)
    unknown_targets = sorted(v for v in mapping.values() if v not in exact)
    if unknown_targets:
        raise ConfigError(
            "the class mapping names classes the model does not have: "
            f"{', '.join(unknown_targets)}; "
            f"the model's classes are: {', '.join(model_classes)}"
        )
    stray = sorted(set(mapping) - set(data_classes))
    if stray:
        raise ConfigError(
            f"the class mapping names classes the data does not have: {', '.join(stray)}; "
            f"the data's classes are: {', '.join(data_classes)}"
        )
    index, unmatched = [], []
    for name in data_classes:
        if name in mapping:
            index.append(exact[mapping[name]])
        elif name in exact:
            index.append(exact[name])
        elif len(keys.get(_name_key(name), [])) == 1:
            index.append(keys[_name_key(name)][0])
        else:
            unmatched.append(name)
            index.append(-1)
    if unmatched and not skip_unknown:
        raise ConfigError(
            f"the data's classes {', '.join(unmatched)} match none of the model's classes "
            f"({', '.join(model_classes)}); name each class folder after a model class (case and "
            "punctuation "
            "aside: t-shirt-top is T-shirt/top), or map it: --class-map FOLDER=CLASS (repeatable), "
            "or leave those folders out: --skip-unknown-classes"
        )
    taken: dict[int, list[str]] = {}
    for name, i in zip(data_classes, index, strict=True):
        if i >= 0:
            taken.setdefault(i, []).append(name)
    doubled = [
        f"{' and '.join(names)} -> {model_classes[i]}"
        for i, names in taken.items()
        if len(names) > 1
    ]
    if doubled:
        raise ConfigError(f"several data classes map to one model class: {'; '.join(doubled)}")
    return np.asarray(index, dtype=np.int64), {
        n: model_classes[i] for n, i in zip(data_classes, index, strict=True) if i >= 0
    }


def _last_dim(shape: list) -> int | None:
    return shape[-1] if shape and isinstance(shape[-1], int) else None
