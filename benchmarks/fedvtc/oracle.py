"""The oracle of the FedVTC benchmark: one classifier trained centrally on the whole Fashion-MNIST
training set, kept out of the federation, that scores the decoder's samples (the server option
``oracle``; metric ``oracle_agreement``, issue 17).

``python -m benchmarks.fedvtc.oracle`` trains it (about a minute on 2 cores) into
``benchmarks/fedvtc/oracle.safetensors`` with its test accuracy in ``oracle.json``; the benchmark
trains it the first time it runs and reuses the committed file after that.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
#: relative to the repository root, where benchmarks run: the cells' cache keys stay the same on
#: every clone
PATH = "benchmarks/fedvtc/oracle.safetensors"
MODEL = {"family": "cnn", "tier": "5", "width": 0.5}
EPOCHS, LR, BATCH, SEED = 3, 1e-3, 64, 0


def ensure(root: Path) -> Path:
    """The oracle's file under ``root``, trained first when it is not there."""
    path = root / PATH
    if not path.is_file():
        train(path)
    return path


def train(path: Path) -> dict:
    from edgefl.data import dataset_info, load_dataset
    from edgefl.models import ModelSpec, build_model
    from edgefl.models.files import save_model_file

    info = dataset_info("fashion-mnist")
    spec = ModelSpec(
        MODEL["family"], MODEL["tier"], info.num_classes, info.in_shape, width=MODEL["width"]
    )
    torch.manual_seed(SEED)
    model = build_model(spec)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    train_set, test_set = (
        load_dataset("fashion-mnist", "train"),
        load_dataset("fashion-mnist", "test"),
    )
    rng = np.random.default_rng(SEED)
    start = time.perf_counter()
    for epoch in range(EPOCHS):
        model.train()
        for x, y in train_set.batches(BATCH, shuffle=True, rng=rng):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
        print(f"oracle: epoch {epoch + 1}/{EPOCHS} done ({time.perf_counter() - start:.0f} s)")
    model.eval()
    with torch.no_grad():
        correct = sum(
            int((model(x).argmax(1) == y).sum()) for x, y in test_set.batches(1000, shuffle=False)
        )
    record = {
        "model": MODEL,
        "epochs": EPOCHS,
        "optimizer": f"adam lr {LR}",
        "batch_size": BATCH,
        "seed": SEED,
        "train_images": len(train_set),
        "test_accuracy": correct / len(test_set),
        "seconds": round(time.perf_counter() - start, 1),
    }
    save_model_file(model, path, dataset="fashion-mnist")
    path.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"oracle: {100 * record['test_accuracy']:.2f} % on the test set → {path}")
    return record


if __name__ == "__main__":
    train(HERE.parents[1] / PATH)
