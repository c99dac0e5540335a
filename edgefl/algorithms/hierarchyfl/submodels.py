"""HeteroFL's half of :mod:`edgefl.algorithms.hierarchyfl`: sub-models cut from one global model
by name and leading slice, the device that trains one, and the server's layer-aligned averaging
of their deltas. The derivation: docs/methods/hierarchyfl.md."""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import torch
from torch import Tensor, nn

from edgefl.algorithms.base import DeviceHalf, ServerContext, ServerHalf
from edgefl.algorithms.training import recalibrate_batch_norm, train_round
from edgefl.errors import ConfigError
from edgefl.models import ModelSpec, build_model
from edgefl.privacy import Release
from edgefl.wire import ArraySpec, Payload, array_spec, arrays_to_state, state_to_arrays

log = logging.getLogger(__name__)

WEIGHTS = "w/"
DELTAS = "d/"

#: The tier that builds the global model, per hierarchy family.
GLOBAL_TIERS = {"hierarchy-depth": "all", "hierarchy-width": "1"}


@dataclass(frozen=True)
class HeteroFLOptions:
    weighting: Literal["uniform", "samples"] = "uniform"  # how holders of a tensor are averaged
    # BatchNorm running statistics of the sub-model a device receives: "average" (the mean of the
    # uploads' statistics, as sent) or "recalibrate" (re-estimated by the device on its own training
    # data for the received weights: averaged weights do not produce the averaged statistics)
    bn_stats: Literal["average", "recalibrate"] = "recalibrate"


# --- the hierarchy -----------------------------------------------------------------------------


def global_spec(spec: ModelSpec) -> ModelSpec:
    """The spec of the global model that ``spec`` is a sub-model of."""
    if spec.family not in GLOBAL_TIERS:
        raise ConfigError(
            f"HierarchyFL/HeteroFL need a hierarchy family ({', '.join(GLOBAL_TIERS)}), "
            f"got {spec.family!r}"
        )
    return replace(spec, tier=GLOBAL_TIERS[spec.family])


@functools.lru_cache(maxsize=64)
def template(spec: ModelSpec) -> nn.Module:
    with torch.random.fork_rng():
        return build_model(spec)


def state_shapes(spec: ModelSpec, floating_only: bool = False) -> dict[str, torch.Size]:
    """Names and shapes of the state dict of the model ``spec`` builds (cached per spec);
    ``floating_only`` leaves out integer buffers (BatchNorm's ``num_batches_tracked``)."""
    state = template(spec).state_dict()
    return {k: v.shape for k, v in state.items() if v.is_floating_point() or not floating_only}


def leading(shape: Iterable[int]) -> tuple[slice, ...]:
    return tuple(slice(0, s) for s in shape)


def aligned_average(
    global_state: Mapping[str, np.ndarray],
    updates: Iterable[tuple[Mapping[str, np.ndarray], float]],
) -> tuple[dict[str, np.ndarray], float]:
    """Layer-aligned averaging of sub-model deltas (by name and leading slice).

    Each element of each global tensor moves by the weighted mean of the deltas of the updates
    that hold it; elements no update holds keep their value. The sums are folded as the updates
    arrive, so memory is two global models whatever the number of devices. Returns the new state
    and the share of global elements that some update held.
    """
    sums: dict[str, np.ndarray] = {}
    weights: dict[str, np.ndarray] = {}
    for deltas, w in updates:
        if w <= 0:
            continue
        for name, delta in deltas.items():
            region = leading(np.shape(delta))
            if name not in sums:
                sums[name] = np.zeros(np.shape(global_state[name]), np.float64)
                weights[name] = np.zeros(np.shape(global_state[name]), np.float64)
            sums[name][region] += w * np.asarray(delta, np.float64)
            weights[name][region] += w
    out, held, total = {}, 0, 0
    for name, value in global_state.items():
        total += np.size(value)
        if name not in sums:
            out[name] = value
            continue
        mask = weights[name] > 0
        held += int(mask.sum())
        step = np.divide(sums[name], weights[name], out=np.zeros_like(sums[name]), where=mask)
        out[name] = (np.asarray(value, np.float64) + step).astype(np.asarray(value).dtype)
    return out, held / max(total, 1)


# --- device half -------------------------------------------------------------------------------


class SubModelDevice(DeviceHalf):
    """Loads its sub-model from the downlink (``bn_stats=recalibrate``: and re-estimates its
    BatchNorm statistics on its own data), trains it with CE, uploads the deltas."""

    anchor: dict[str, Tensor] | None = None
    dp_sgd_ready = True  # one train_local per round with cross-entropy; deltas of its weights only

    def expected_downlink(self) -> dict[str, ArraySpec]:
        """This tier's sub-model of the global model, in its shapes."""
        return self.weight_specs(WEIGHTS)

    def receive(self, round: int, payload: Payload) -> None:
        state = arrays_to_state(payload.arrays, WEIGHTS)
        if state:
            self.model.load_state_dict(state, strict=True)
            self.anchor = {
                k: v.detach().clone()
                for k, v in self.model.state_dict().items()
                if v.is_floating_point()
            }
            # the deltas stay relative to the statistics received, so the server's average of the
            # uploads' statistics is what it was; recalibrating only changes what this device
            # evaluates and keeps with (and where its running statistics start the round)
            if self.options.bn_stats == "recalibrate":
                recalibrate_batch_norm(self.model, self.ctx.train_data)

    @classmethod
    def privacy_release(cls, options) -> Release:
        """The sub-model's weight deltas, clipped as one update (they are distances already)."""
        return Release(whole=(DELTAS,), reference="zero")

    def fit(self, round: int) -> Payload:
        if self.anchor is None:  # never received a model: train from the own init, deltas from it
            self.anchor = {
                k: v.detach().clone()
                for k, v in self.model.state_dict().items()
                if v.is_floating_point()
            }
        meta = train_round(self, round)
        state = self.model.state_dict()
        deltas = {
            DELTAS + k: (state[k].detach() - a).cpu().numpy().astype(np.float32)
            for k, a in self.anchor.items()
        }
        return Payload(deltas, meta)


# --- server halves -----------------------------------------------------------------------------


class HeteroFLServer(ServerHalf):
    """Holds the global model; layer-aligned averaging of the sub-model deltas."""

    def __init__(self, ctx: ServerContext, options: HeteroFLOptions):
        super().__init__(ctx, options)
        specs = ctx.specs()
        if not specs:
            raise ConfigError("the fleet is empty")
        self.spec = global_spec(specs[0])
        for s in specs[1:]:
            self._check_spec(s)
        with torch.random.fork_rng():
            torch.manual_seed(ctx.seed)
            self.model = build_model(self.spec)
        self.trainable = frozenset(name for name, _ in self.model.named_parameters())
        self._downlinks: dict[ModelSpec, dict[str, np.ndarray]] = {}

    def _check_spec(self, spec: ModelSpec) -> None:
        if global_spec(spec) != self.spec:
            raise ConfigError(
                f"device model {spec.name} is not a sub-model of the global model {self.spec.name}"
            )

    # downlink: the device's sub-model, cut from the current global model ------------------------
    def downlink(self, round: int, device_id: str) -> Payload:
        spec = self.ctx.fleet[device_id].spec  # live: a device that joined just now is served too
        if spec not in self._downlinks:
            self._check_spec(spec)
            state = self.model.state_dict()
            sub = {k: state[k][leading(s)] for k, s in state_shapes(spec).items()}
            self._downlinks[spec] = state_to_arrays(sub, WEIGHTS)
        return Payload(dict(self._downlinks[spec]))

    def expected_uplink(self, device_id: str) -> dict[str, ArraySpec] | None:
        """The deltas of every float tensor of the device's sub-model, in its tier's shapes."""
        record = self.ctx.fleet.get(device_id)
        if record is None:
            return None
        shapes = state_shapes(record.spec, floating_only=True)
        return {DELTAS + k: array_spec(np.float32, tuple(s)) for k, s in shapes.items()}

    # aggregation --------------------------------------------------------------------------------
    def _valid_deltas(self, device_id: str, payload: Payload) -> dict[str, np.ndarray] | None:
        record = self.ctx.fleet.get(device_id)
        if record is None:
            return None
        expected = {k: tuple(s) for k, s in state_shapes(record.spec, floating_only=True).items()}
        deltas = {k[len(DELTAS) :]: v for k, v in payload.arrays.items() if k.startswith(DELTAS)}
        problem = None
        if set(deltas) != set(expected):
            problem = f"tensor names differ from tier {record.spec.tier}"
        elif any(tuple(np.shape(v)) != expected[k] for k, v in deltas.items()):
            problem = f"tensor shapes differ from tier {record.spec.tier}"
        elif not all(np.all(np.isfinite(v)) for v in deltas.values()):
            problem = "non-finite values"
        if problem:
            log.warning("dropping the update of %s: %s", device_id, problem)
            return None
        return deltas

    def average(self, uplinks: Mapping[str, Payload]) -> dict[str, float]:
        valid = {d: self._valid_deltas(d, p) for d, p in uplinks.items()}
        use = {d: v for d, v in valid.items() if v is not None}
        state = {k: v.detach().numpy() for k, v in self.model.state_dict().items()}

        def weight(d: str) -> float:
            return (
                float(uplinks[d].meta.get("num_samples", 0))
                if self.options.weighting == "samples"
                else 1.0
            )

        new, coverage = aligned_average(state, ((v, weight(d)) for d, v in use.items()))
        if use:  # the run's server optimizer turns the aligned average into the step (an element
            # no device held has a zero pseudo-gradient; the moments still carry it)
            new = self.server_opt.step("global", state, new, self.trainable)
        self.model.load_state_dict(
            {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in new.items()}
        )
        self._downlinks.clear()
        return {
            "averaged_devices": float(len(use)),
            "rejected_updates": float(len(valid) - len(use)),
            "coverage": coverage,
        }

    def aggregate(self, round: int, uplinks: Mapping[str, Payload]) -> dict[str, float]:
        return self.average(uplinks)

    # checkpoints --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        return {**state_to_arrays(self.model.state_dict(), WEIGHTS), **self.server_opt.state_dict()}

    def load_state_dict(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.model.load_state_dict(arrays_to_state(arrays, WEIGHTS), strict=True)
        self.server_opt.load_state_dict(arrays)
        self._downlinks.clear()
