"""``bench-echo``: the toy workload of the overhead benchmark (registered only when imported).

Trivial local work: a device returns the array it was sent; the server averages the uplinks
(FedAvg's fold) and sends the mean back. ``-o floats=N`` sets the payload (float32 values):
11_173_962 is ResNet-18's parameter count (45 MB). The same workload runs in Flower
(``flower_toy.py``: a NumPyClient that returns its parameters, FedAvg).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgefl.algorithms.base import Algorithm, DeviceHalf, ServerHalf, get_algorithm, register
from edgefl.wire import Payload, array_spec

RESNET18_FLOATS = 11_173_962


@dataclass(frozen=True)
class EchoOptions:
    floats: int = 1000


class EchoDevice(DeviceHalf):
    #: its fit trains nothing: no network to copy before a round (the agent's undo)
    undo_failed_rounds = False

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.weights: np.ndarray | None = None

    def receive(self, round: int, payload: Payload) -> None:
        if "weights" in payload.arrays:
            self.weights = payload.arrays["weights"]

    def fit(self, round: int) -> Payload:
        weights = (
            self.weights if self.weights is not None else np.zeros(self.options.floats, np.float32)
        )
        return Payload({"weights": weights}, {"num_samples": len(self.ctx.train_data)})


class EchoServer(ServerHalf):
    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.weights = np.random.default_rng(0).standard_normal(options.floats).astype(np.float32)

    def downlink(self, round: int, device_id: str) -> Payload:
        return Payload({"weights": self.weights})

    def aggregate(self, round: int, uplinks) -> dict[str, float]:
        if uplinks:
            total = np.zeros_like(self.weights)
            for p in uplinks.values():
                total += p.arrays["weights"]
            self.weights = total / np.float32(len(uplinks))
        return {}

    def expected_uplink(self, device_id: str):
        return {"weights": array_spec(np.float32, (self.options.floats,))}

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"weights": self.weights}


try:
    get_algorithm("bench-echo")
except KeyError:
    register(
        Algorithm(
            name="bench-echo",
            description="overhead benchmark: devices echo the server's array (no local work)",
            device=EchoDevice,
            server=EchoServer,
            options=EchoOptions,
            defaults={"model": "cnn", "tiers": ("1",), "width": 0.25},
        )
    )
