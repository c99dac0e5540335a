"""Regenerate the host-exported models the torch-free tests use (needs the [all] install):

    PYTHONPATH=. python tests/base/make_model.py

- ``synthetic-cnn.onnx``: a tier-2 CNN trained on the synthetic dataset (10 classes
  "pattern-0" … "pattern-9", 1×28×28);
- ``fashion-cnn.onnx``: the same CNN trained on 6000 Fashion-MNIST images (its real class names).

Both are exported with their class names in the ONNX metadata.
"""

from pathlib import Path

import numpy as np
import torch

from edgefl.data import load_dataset
from edgefl.export.onnx_export import export_model
from edgefl.models import ModelSpec, build_model

HERE = Path(__file__).parent


def train_and_export(dataset: str, out: Path, samples: int | None = None, epochs: int = 2) -> None:
    torch.manual_seed(0)
    train = load_dataset(dataset, "train")
    if samples is not None:
        train = train.subset(np.random.default_rng(0).permutation(len(train))[:samples])
    info = train.info
    model = build_model(
        ModelSpec(
            "cnn", "2", info.num_classes, info.in_shape, width=0.25, mean=info.mean, std=info.std
        )
    )
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(epochs):
        for x, y in train.batches(64, shuffle=True, rng=np.random.default_rng(0)):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    model.eval()
    test = load_dataset(dataset, "test")
    report = export_model(
        model,
        out,
        class_names=info.class_names,
        parity_images=test.images(np.arange(64)),
        calibration_images=train.images(np.arange(256)),
    )
    print(f"wrote {out} ({out.stat().st_size} bytes), max |diff| {report.max_abs_diff:.2g}")


def main() -> None:
    train_and_export("synthetic", HERE / "synthetic-cnn.onnx")
    train_and_export("fashion-mnist", HERE / "fashion-cnn.onnx", samples=6000)


if __name__ == "__main__":
    main()
