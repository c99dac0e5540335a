"""Regenerate tests/base/synthetic-cnn.onnx, the host-exported model the torch-free tests use.

    PYTHONPATH=. python tests/base/make_model.py      (needs the [all] install)

A tier-2 CNN trained for one epoch on the synthetic dataset (10 classes "pattern-0" … "pattern-9",
1×28×28), exported with its class names in the ONNX metadata.
"""

from pathlib import Path

import numpy as np
import torch

from edgefl.data import load_dataset
from edgefl.export import export_model
from edgefl.models import ModelSpec, build_model

OUT = Path(__file__).with_name("synthetic-cnn.onnx")


def main() -> None:
    torch.manual_seed(0)
    train = load_dataset("synthetic", "train")
    info = train.info
    model = build_model(ModelSpec("cnn", "2", info.num_classes, info.in_shape, width=0.25, mean=info.mean, std=info.std))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(2):
        for x, y in train.batches(64, shuffle=True, rng=np.random.default_rng(0)):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    model.eval()
    test = load_dataset("synthetic", "test")
    report = export_model(model, OUT, class_names=info.class_names, parity_images=test.images(np.arange(64)),
                          calibration_images=train.images(np.arange(256)))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes), max |diff| {report.max_abs_diff:.2g}")


if __name__ == "__main__":
    main()
