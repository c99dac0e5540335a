"""Diagnostic: one FedVTC device alone on 600 Fashion-MNIST images, its own ψ decoding its own
class means (no federation: no averaged prototypes, no averaged ψ). Prints, every third epoch, the
training terms, the device's test accuracy (1,000 test images), the oracle's share of 20 samples
per class assigned to the intended class, the device's own model's share, and how much the
per-class mean images differ (0: ψ decodes every class to the same image).

    python -m benchmarks.fedvtc.investigations.single_device TC_WEIGHT LR sgd|adam
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from benchmarks.fedvtc import oracle
from benchmarks.runner import ROOT
from edgefl.algorithms import DeviceContext, TrainSettings, get_algorithm
from edgefl.algorithms.fedproto import local_prototypes
from edgefl.algorithms.fedvtc import generate, load_oracle
from edgefl.algorithms.training import evaluate
from edgefl.data import load_dataset
from edgefl.models import ModelSpec
from edgefl.wire import Payload


def main(tc_weight: float, lr: float, optimizer: str, epochs: int = 12) -> None:
    torch.set_num_threads(1)
    spec = ModelSpec("cnn", "3", 10, (1, 28, 28), width=0.25, feature_dim=980)
    data = load_dataset("fashion-mnist", "train").subset(
        np.random.default_rng(0).choice(60000, 600, replace=False)
    )
    test = load_dataset("fashion-mnist", "test").subset(np.arange(1000))
    algo = get_algorithm("fedvtc")
    settings = TrainSettings(batch_size=16, epochs=1, lr=lr, momentum=0.0, optimizer=optimizer)
    device = algo.device(DeviceContext("d00", spec, data, settings, seed=1, rounds=epochs),
                         algo.parse_options({"tc_weight": str(tc_weight)}))
    device.receive(0, Payload({}, {"vtc_seed": 7}))
    judge = load_oracle(ROOT / oracle.PATH, spec, 10)
    for epoch in range(epochs):
        stats = device.train_round(epoch)
        # its own class means, every epoch
        for c, v in local_prototypes(device.model, data).items():
            device.protos[c] = torch.from_numpy(np.asarray(v, np.float32))
            device.known[c] = True
        if epoch % 3 == 2:
            x, y = generate(device.psi, device.protos, device.log_sigma.exp(), list(range(10)), 20,
                            torch.Generator().manual_seed(0))
            with torch.no_grad():
                judged = float((judge(x).argmax(1) == y).float().mean())
                device.model.eval()
                own = float((device.model(x).argmax(1) == y).float().mean())
                device.model.train()
            spread = float(x.reshape(10, 20, -1).mean(1).std(0).mean())
            print(
                f"epoch {epoch + 1}: ce {stats['ce']:.3f} l_rc {stats['l_rc']:.1f} σ "
                f"{stats['sigma_mean']:.3f} "
                f"test {100 * evaluate(device.model, test)['accuracy']:.1f} % oracle "
                f"{100 * judged:.0f} % "
                f"own model {100 * own:.0f} % class-image spread {spread:.3f}"
            )


if __name__ == "__main__":
    main(float(sys.argv[1]), float(sys.argv[2]), sys.argv[3])
