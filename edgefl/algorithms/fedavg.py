"""FedAvg (McMahan et al., 2017): one global model, averaged weighted by local data size.

Also the home of the global-model halves that FedProx and FedDW build on. The defaults are ours
(the paper tunes its lr per task): the tier-2 CNN with :data:`CNN_RECIPE`, chosen for stability on a
validation split (``benchmarks/foundation/recipes.md``), shared with FedProx and Local.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from edgefl.algorithms.aggregate import Defences, clip_update, defences_of, robust_average
from edgefl.algorithms.base import Algorithm, DeviceHalf, MethodNeeds, ServerHalf, register
from edgefl.algorithms.training import train_round
from edgefl.models import build_model
from edgefl.privacy import Release
from edgefl.wire import ArraySpec, Payload, arrays_to_state, spec_of, state_to_arrays

WEIGHTS = "w/"


class GlobalModelDevice(DeviceHalf):
    """Loads the global weights it receives, trains, and sends its weights back."""

    # one train_local per round, cross-entropy (FedProx: plus its proximal penalty)
    dp_sgd_ready = True

    def receive(self, round: int, payload: Payload) -> None:
        state = arrays_to_state(payload.arrays, WEIGHTS)
        if state:
            self.model.load_state_dict(state, strict=True)

    def expected_downlink(self) -> dict[str, ArraySpec]:
        """The global model's weights, in this model's dtypes and shapes."""
        return self.weight_specs(WEIGHTS)

    @classmethod
    def privacy_release(cls, options) -> Release:
        """The trained weights, clipped as one update from the weights received."""
        return Release(whole=(WEIGHTS,))

    def loss_fn(self, round: int):
        """The local objective; None = plain cross-entropy. Subclasses add their terms."""
        return None

    def fit(self, round: int) -> Payload:
        meta = train_round(self, round, self.loss_fn(round))
        return Payload(state_to_arrays(self.model.state_dict(), WEIGHTS), meta)


class GlobalModelServer(ServerHalf):
    """Holds the global model; averages uplinked weights by the devices' sample counts."""

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        spec = ctx.single_spec(type(self).__name__)
        with torch.random.fork_rng():
            torch.manual_seed(ctx.seed)
            model = build_model(spec)
        self.weights: dict[str, np.ndarray] = state_to_arrays(model.state_dict(), WEIGHTS)
        self.trainable = frozenset(WEIGHTS + name for name, _ in model.named_parameters())

    def downlink(self, round: int, device_id: str) -> Payload:
        return Payload(dict(self.weights))

    def aggregate(self, round: int, uplinks: Mapping[str, Payload]) -> dict[str, float]:
        if not uplinks:
            return {}
        d = defences_of(self.options)  # optional bounds on a malicious update's influence
        items = [
            (
                {k: v for k, v in p.arrays.items() if k.startswith(WEIGHTS)},
                float(p.meta["num_samples"]),
            )
            for p in uplinks.values()
        ]
        if d.clip_norm > 0:
            items = [(clip_update(a, self.weights, d.clip_norm), w) for a, w in items]
        self.weights = self.server_opt.step(
            "global", self.weights, robust_average(items, d.aggregator, d.trim), self.trainable
        )
        return {}

    def state_dict(self) -> dict[str, np.ndarray]:
        return {**self.weights, **self.server_opt.state_dict()}

    def expected_uplink(self, device_id: str) -> dict[str, ArraySpec]:
        """Every weight of the global model, in its dtype and shape."""
        return {k: spec_of(v) for k, v in self.weights.items()}

    def load_state_dict(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.weights = {k: np.array(v) for k, v in arrays.items() if k.startswith(WEIGHTS)}
        self.server_opt.load_state_dict(arrays)


#: The CNN family's recipe (FedAvg, FedProx, Local): SGD lr 0.01 with momentum 0.9, chosen for
#: stability over five seeds on a validation split by benchmarks/foundation/recipes.py (issue 37):
#: at lr 0.05 a FedAvg run on Dir(0.1) fell to chance and the centralized bound declined from its
#: peak.
CNN_RECIPE = {"optimizer": "sgd", "lr": 0.01, "momentum": 0.9}
PAPER_DEFAULTS = {"model": "cnn", "tiers": ("2",), **CNN_RECIPE, "batch_size": 32, "epochs": 1}

#: FedAvg's registry entry (FedProx's is this one with its own device and options).
FEDAVG = register(
    Algorithm(
        name="fedavg",
        description="FedAvg: average the weights of one shared architecture (weighted by data "
        "size)",
        device=GlobalModelDevice,
        server=GlobalModelServer,
        options=Defences,
        defaults=PAPER_DEFAULTS,
        needs=MethodNeeds(averages_weights=True, asynchronous=True),
    )
)
