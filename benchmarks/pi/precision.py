"""Which side of the export parity check loses precision on an (emulated) ARM CPU, and why.

Run inside the arm64 root's [train] venv (with onnx) under a chosen QEMU_CPU; run.sh does it for
the Pi 5's cortex-a76, QEMU's `max` (SVE, SME, BF16 ...), `max` without SVE or without SME, and
the A64FX (SVE without BF16). A plain matmul and a small CNN are evaluated in float32 by PyTorch
(default settings, and with oneDNN off) and by ONNX Runtime (default session, and with MLAS's
arm64 BF16 fast-math gemm explicitly off and on), each compared with the same computation in
float64: the side whose error is far above float32's ~1e-6 is the one leaving float32. Then
edgefl's own `export_model` runs its parity check on the CNN. Prints one JSON object.
"""

import io
import json
import os
import platform
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

from edgefl.models import ModelSpec, build_model

# Linux's arm64 HWCAP bits (asm/hwcap.h), read from the auxiliary vector: qemu-user fills it for
# the emulated CPU, while /proc/cpuinfo shows the host's.
HWCAP = {"asimddp": 20, "sve": 22}
HWCAP2 = {"sve2": 1, "svebf16": 12, "i8mm": 13, "bf16": 14, "ebf16": 32, "sme": 23}


def hwcaps() -> str:
    try:
        raw = np.frombuffer(Path("/proc/self/auxv").read_bytes(), dtype=np.uint64).reshape(-1, 2)
    except (OSError, ValueError):
        return ""
    aux = {int(k): int(v) for k, v in raw}
    hw, hw2 = aux.get(16, 0), aux.get(26, 0)
    names = [n for n, bit in HWCAP.items() if hw >> bit & 1] + [
        n for n, bit in HWCAP2.items() if hw2 >> bit & 1
    ]
    return " ".join(names)


def max_err(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def _setting(path: str):
    obj = torch.backends
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return str(obj)


def _onnx(model: nn.Module, example: torch.Tensor) -> bytes:
    buf = io.BytesIO()
    torch.onnx.export(model, (example,), buf, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "n"}, "y": {0: "n"}}, dynamo=False)
    return buf.getvalue()


def _ort(proto: bytes, x: np.ndarray, **config: str) -> np.ndarray:
    import onnxruntime as ort

    options = ort.SessionOptions()
    for key, value in config.items():
        options.add_session_config_entry(key, value)
    session = ort.InferenceSession(proto, options, providers=["CPUExecutionProvider"])
    return session.run(["y"], {"x": x})[0]


def main() -> None:
    torch.manual_seed(0)
    if os.environ.get("FLOAT32_MATMUL_PRECISION"):  # what a training script may set for speed
        torch.set_float32_matmul_precision(os.environ["FLOAT32_MATMUL_PRECISION"])
    out = {
        "machine": platform.machine(), "torch": torch.__version__,
        "qemu_cpu": os.environ.get("QEMU_CPU", ""),
        "ONEDNN_DEFAULT_FPMATH_MODE": os.environ.get("ONEDNN_DEFAULT_FPMATH_MODE", ""),
        "FLOAT32_MATMUL_PRECISION": os.environ.get("FLOAT32_MATMUL_PRECISION", ""),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "mkldnn_fp32_precision": _setting("mkldnn.fp32_precision"),
        "mkldnn_matmul_fp32_precision": _setting("mkldnn.matmul.fp32_precision"),
        "mkldnn_conv_fp32_precision": _setting("mkldnn.conv.fp32_precision"),
    }
    out["cpu_features"] = hwcaps()
    import onnxruntime

    out["onnxruntime"] = onnxruntime.__version__

    a, b = torch.randn(64, 256), torch.randn(256, 256)
    ref = (a.double() @ b.double()).numpy()
    out["matmul_torch_fp32_vs_fp64"] = max_err((a @ b).numpy(), ref)
    linear = nn.Linear(256, 256, bias=False).eval()
    with torch.no_grad():
        linear.weight.copy_(b.t())
        proto = _onnx(linear, a[:1])
    out["matmul_ort_fp32_vs_fp64"] = max_err(_ort(proto, a.numpy()), ref)
    out["matmul_ort_bf16_fastmath_on_vs_fp64"] = max_err(
        _ort(proto, a.numpy(), **{"mlas.enable_gemm_fastmath_arm64_bfloat16": "1"}), ref)

    spec = ModelSpec("cnn", "2", 10, (1, 28, 28), width=0.25)
    model = build_model(spec).eval()
    x = torch.rand(32, 1, 28, 28)
    with torch.no_grad():
        ref = model.double()(x.double()).numpy()
        model.float()
        out["cnn_logit_scale"] = float(np.max(np.abs(ref)))
        out["cnn_torch_fp32_vs_fp64"] = max_err(model(x).numpy(), ref)
        with torch.backends.mkldnn.flags(enabled=False):
            out["cnn_torch_fp32_no_onednn_vs_fp64"] = max_err(model(x).numpy(), ref)
        out["cnn_torch_batch1_vs_fp64"] = max(
            max_err(model(x[i : i + 1]).numpy(), ref[i : i + 1]) for i in range(8)
        )
        proto = _onnx(model, x[:1])
    out["cnn_ort_fp32_vs_fp64"] = max_err(_ort(proto, x.numpy()), ref)
    out["cnn_ort_fastmath_off_vs_fp64"] = max_err(
        _ort(proto, x.numpy(), **{"mlas.enable_gemm_fastmath_arm64_bfloat16": "0"}), ref)
    out["cnn_ort_batch1_vs_fp64"] = max(
        max_err(_ort(proto, x[i : i + 1].numpy()), ref[i : i + 1]) for i in range(8)
    )

    from edgefl.export.errors import ExportError
    from edgefl.export.onnx_export import export_model

    with tempfile.TemporaryDirectory() as tmp:
        try:
            report = export_model(
                model,
                Path(tmp) / "m.onnx",
                class_names=[str(i) for i in range(10)],
                parity_images=x[:8],
            )
            out["edgefl_export"] = {
                "ok": True,
                "parity": report.to_dict().get("parity_max_abs_diff"),
            }
        except ExportError as exc:
            out["edgefl_export"] = {"ok": False, "error": str(exc)[:400]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
