"""Static int8 quantization of an exported model with ONNX Runtime (QDQ, per-channel weights).

    report = quantize_int8("d03.onnx", "d03.int8.onnx", calibration_images=x_train[:256])

Scheme: `onnxruntime.quantization.quantize_static` in QDQ format — weights int8 symmetric per
output channel, activations uint8 with ranges calibrated (MinMax) on training images; this
U8S8 combination is what ORT's x86 CPU kernels run fastest (VNNI, or AVX2). The graph is first
pre-processed (`quant_pre_process`: shape inference and ORT graph optimisation) as ORT advises.
The metadata of the fp32 file is carried over, with `edgefl.quantization` naming the scheme.

Dynamic int8 quantization is deliberately not offered: for conv nets on CPU it is slower than
fp32 (activations are quantized on the fly and convolutions gain little); it pays off only for
Linear/LSTM-heavy models, which this zoo does not have.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgefl.export.errors import ExportError
from edgefl.export.onnx_export import INPUT_NAME, read_metadata, set_metadata
from edgefl.inference import META_QUANTIZATION

log = logging.getLogger(__name__)

SCHEME = "int8 static QDQ: weights int8 per-channel symmetric, activations uint8 MinMax-calibrated"


@dataclass
class QuantizeReport:
    path: Path
    size_bytes: int
    fp32_size_bytes: int
    calibration_samples: int
    scheme: str = SCHEME

    @property
    def size_ratio(self) -> float:
        return self.size_bytes / self.fp32_size_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "size_bytes": self.size_bytes,
            "fp32_size_bytes": self.fp32_size_bytes,
            "size_ratio": self.size_ratio,
            "calibration_samples": self.calibration_samples,
            "scheme": self.scheme,
        }


def _reader(images: np.ndarray, batch_size: int):
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._batches = iter(
                [{INPUT_NAME: images[i : i + batch_size]} for i in range(0, len(images), batch_size)]
            )

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._batches, None)

    return Reader()


def quantize_int8(
    model_path: str | Path,
    out_path: str | Path,
    calibration_images: torch.Tensor | np.ndarray,
    *,
    per_channel: bool = True,
    batch_size: int = 64,
) -> QuantizeReport:
    """Write the static int8 QDQ version of the fp32 ONNX file `model_path` to `out_path`.

    `calibration_images`: float [N, C, H, W] in [0, 1], training samples (a few hundred suffice).
    """
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    model_path, out_path = Path(model_path), Path(out_path)
    images = calibration_images.numpy() if isinstance(calibration_images, torch.Tensor) else calibration_images
    images = np.ascontiguousarray(images, dtype=np.float32)
    if images.ndim != 4 or len(images) == 0:
        raise ExportError(f"calibration images must be a non-empty [N, C, H, W] array, got {images.shape}")
    metadata = read_metadata(model_path)
    with tempfile.TemporaryDirectory(prefix="edgefl-quant-") as tmp:
        prepared = Path(tmp) / "prepared.onnx"
        quantized = Path(tmp) / "quantized.onnx"
        try:
            quant_pre_process(str(model_path), str(prepared), skip_symbolic_shape=True)
            quantize_static(
                str(prepared),
                str(quantized),
                _reader(images, batch_size),
                quant_format=QuantFormat.QDQ,
                per_channel=per_channel,
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                calibrate_method=CalibrationMethod.MinMax,
            )
        except ExportError:
            raise
        except Exception as exc:
            raise ExportError(f"int8 quantization of {model_path} failed: {exc}") from exc
        proto = onnx.load(str(quantized))
    set_metadata(proto, {**metadata, META_QUANTIZATION: SCHEME if per_channel else SCHEME.replace("per-channel", "per-tensor")})
    proto.producer_name = "edgefl"
    try:
        onnx.checker.check_model(proto)
    except Exception as exc:
        raise ExportError(f"the quantized graph fails onnx.checker: {exc}") from None
    data = proto.SerializeToString()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_bytes(data)
    return QuantizeReport(out_path, len(data), model_path.stat().st_size, len(images))
