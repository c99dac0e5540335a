"""Which side of the export parity check loses precision on an (emulated) ARM CPU, and why.

Run inside the arm64 root's [train] venv under a chosen QEMU_CPU (run.sh does it for
cortex-a76 and max). A small CNN and a plain matmul are evaluated in float32 by PyTorch (default
settings, oneDNN off, ``float32_matmul_precision`` "highest") and by ONNX Runtime, each compared
with the same computation in float64: the side whose error is far above float32's ~1e-6 is the
one taking a reduced-precision path. Prints one JSON object.
"""

import io
import json
import platform

import numpy as np
import torch

from edgefl.models import ModelSpec, build_model


def max_err(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def main() -> None:
    torch.manual_seed(0)
    out = {"machine": platform.machine(), "torch": torch.__version__,
           "cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "mkldnn": torch.backends.mkldnn.is_available(),
           "float32_matmul_precision": torch.get_float32_matmul_precision()}
    try:
        out["cpu_features"] = open("/proc/cpuinfo").read().split("Features")[1].splitlines()[0].strip(": \t")[:400]
    except (OSError, IndexError):
        out["cpu_features"] = ""
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    ref = (a.double() @ b.double()).numpy()
    out["matmul_fp32_vs_fp64"] = max_err((a @ b).numpy(), ref)

    spec = ModelSpec("cnn", "2", 10, (1, 28, 28), width=0.25)
    model = build_model(spec).eval()
    x = torch.rand(32, 1, 28, 28)
    with torch.no_grad():
        ref = model.double()(x.double()).numpy()
        model.float()
        out["cnn_torch_fp32_vs_fp64"] = max_err(model(x).numpy(), ref)
        with torch.backends.mkldnn.flags(enabled=False):
            out["cnn_torch_fp32_no_onednn_vs_fp64"] = max_err(model(x).numpy(), ref)
    try:
        import onnxruntime as ort

        buf = io.BytesIO()
        torch.onnx.export(model, (x[:1],), buf, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "n"}, "y": {0: "n"}}, dynamo=False)
        session = ort.InferenceSession(buf.getvalue(), providers=["CPUExecutionProvider"])
        out["cnn_ort_fp32_vs_fp64"] = max_err(session.run(["y"], {"x": x.numpy()})[0], ref)
    except ImportError as e:  # onnx is needed by torch.onnx.export: part of [server]
        out["cnn_ort_fp32_vs_fp64"] = f"skipped: {e}"
    print(json.dumps(out))


if __name__ == "__main__":
    main()
