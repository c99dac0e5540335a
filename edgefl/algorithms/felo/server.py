"""The server halves of FedHe and Felo (:mod:`edgefl.algorithms.felo`): per-class knowledge with
a bounded history, and per-architecture weight averaging (Felo). Velo's server, the CVAE on top,
is in :mod:`.velo`. The derivation: docs/methods/felo.md."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from typing import ClassVar

import numpy as np
import torch

from edgefl.algorithms.aggregate import (
    Rule,
    clip_to_norm,
    clip_update,
    defences_of,
    robust_average,
    robust_stack,
)
from edgefl.algorithms.base import ServerHalf
from edgefl.algorithms.felo.options import WEIGHTS, FedHeOptions, FeloOptions
from edgefl.errors import ConfigError
from edgefl.models import ModelSpec, build_model
from edgefl.wire import ArraySpec, Payload, array_spec, spec_of, state_to_arrays

log = logging.getLogger(__name__)


class ClassHistory:
    """Per class, a ring buffer of the last ``size`` (vector, weight) entries; the class value is
    the weight-averaged mean of what the buffer holds. Arrays only (checkpointable)."""

    def __init__(self, num_classes: int, dim: int, size: int):
        self.vec = np.zeros((num_classes, size, dim), np.float32)
        self.weight = np.zeros((num_classes, size), np.float64)
        self.next = np.zeros(num_classes, np.int64)

    def add(self, c: int, vector: np.ndarray, weight: float) -> None:
        i = int(self.next[c])
        self.vec[c, i] = vector
        self.weight[c, i] = weight
        self.next[c] = (i + 1) % self.vec.shape[1]

    def known(self) -> np.ndarray:
        return self.weight.sum(1) > 0

    def mean(self) -> np.ndarray:
        """C×dim class means; zeros for classes with nothing stored."""
        total = self.weight.sum(1)
        sums = np.einsum("ch,chd->cd", self.weight, self.vec.astype(np.float64))
        return (sums / np.maximum(total, 1e-300)[:, None] * (total > 0)[:, None]).astype(np.float32)

    def entries(self, c: int) -> np.ndarray:
        return self.vec[c][self.weight[c] > 0]

    def value(self, rule: Rule = "mean", trim: float = 0.2) -> np.ndarray:
        """C×dim class values: :meth:`mean` for ``mean``; otherwise the robust rule over each
        class's stored entries, unweighted (a weight is a device's own claim of its class count,
        which a robust rule must not trust)."""
        if rule == "mean":
            return self.mean()
        out = np.zeros(self.vec.shape[::2], np.float32)
        for c in range(len(out)):
            entries = self.entries(c)
            if len(entries):
                out[c] = robust_stack(list(entries), rule, trim)
        return out

    def state(self, prefix: str) -> dict[str, np.ndarray]:
        return {
            prefix + "vec": self.vec.copy(),
            prefix + "weight": self.weight.copy(),
            prefix + "next": self.next.copy(),
        }

    def load(self, arrays: Mapping[str, np.ndarray], prefix: str) -> None:
        if prefix + "vec" in arrays:
            self.vec = np.array(arrays[prefix + "vec"], np.float32)
            self.weight = np.array(arrays[prefix + "weight"], np.float64)
            self.next = np.array(arrays[prefix + "next"], np.int64)


class FedHeServer(ServerHalf):
    """FedHe's server: class-wise averages of the logits with a bounded history. Felo's extends
    it with features and, when its options share weights, per-architecture FedAvg."""

    #: per-class counts over the local epochs: clipped to the weight bound by the loop
    count_arrays = {"count": "visits"}
    #: devices upload per-class mean features, averaged like the logits (Felo, Velo)
    shares_features: ClassVar[bool] = False

    def __init__(self, ctx, options: FedHeOptions):
        super().__init__(ctx, options)
        self.options: FedHeOptions = options
        c = ctx.num_classes
        self.logits = ClassHistory(c, c, options.history)
        self.weights: dict[str, dict[str, np.ndarray]] = {}  # architecture name → averaged weights
        self.trainable: dict[str, frozenset[str]] = {}  # architecture name → its parameters' names
        self.feature_dim: int | None = None
        self._checked: set[ModelSpec] = set()
        self.features: ClassHistory | None = None
        if self.shares_features or options.shares_weights:
            for spec in ctx.specs():
                self._architecture(spec)
        if self.shares_features:
            self.features = ClassHistory(c, self.feature_dim, options.history)
        # (round, fleet size) → the round's knowledge and devices per architecture: every device's
        # downlink of a round shares them (recomputed per device they made the server's work O(N²))
        self._round_cache: tuple[tuple[int, int], dict[str, np.ndarray], Counter] | None = None

    # the architectures of the fleet (devices may join during a run)
    def _architecture(self, spec: ModelSpec) -> str:
        key = spec.name
        if spec in self._checked:
            return key
        # every architecture starts from the draw FedAvg's global model starts from (the run
        # seed): on a fleet of one architecture, Felo with alpha=0 is then FedAvg, bit for bit
        with torch.random.fork_rng():
            torch.manual_seed(self.ctx.seed)
            model = build_model(spec)
        if self.feature_dim is None:
            self.feature_dim = model.feature_dim
        elif model.feature_dim != self.feature_dim:
            raise ConfigError(
                f"{spec.name} has {model.feature_dim}-d features but the fleet's are "
                f"{self.feature_dim}-d; "
                "give a common --feature-dim"
            )
        if self.options.shares_weights:
            if key in self.weights:
                raise ConfigError(f"two different architectures of the fleet share the name {key}")
            self.weights[key] = state_to_arrays(model.state_dict(), WEIGHTS)
            self.trainable[key] = frozenset(WEIGHTS + name for name, _ in model.named_parameters())
        self._checked.add(spec)
        return key

    def knowledge(self) -> dict[str, np.ndarray]:
        d = defences_of(self.options)
        out = {
            "logit": self.logits.value(d.aggregator, d.trim),
            "known": self.logits.known().astype(np.uint8),
        }
        if self.features is not None:
            out["feat"] = self.feature_mean()
        return out

    def feature_mean(self) -> np.ndarray:
        d = defences_of(self.options)
        return self.features.value(d.aggregator, d.trim)

    def _averaged(self, device_id: str, round: int | None = None) -> str | None:
        """The architecture whose averaged weights ``device_id`` exchanges; None when the options
        share no weights or no other device of the fleet has its architecture (nothing to
        average)."""
        if not self.options.shares_weights:
            return None
        spec = self.ctx.fleet[device_id].spec
        key = self._architecture(spec)
        return (
            key
            if self._round(self.ctx.round if round is None else round)[2][spec.name] >= 2
            else None
        )

    def _round(self, round: int) -> tuple[tuple[int, int], dict[str, np.ndarray], Counter]:
        """The round's knowledge and the fleet's devices per architecture, computed once per round
        and fleet size (devices join between exchanges, never during one)."""
        key = (round, len(self.ctx.fleet))
        if self._round_cache is None or self._round_cache[0] != key:
            self._round_cache = (
                key,
                self.knowledge(),
                Counter(r.spec.name for r in self.ctx.fleet.values()),
            )
        return self._round_cache

    def downlink(self, round: int, device_id: str) -> Payload:
        arrays = dict(self._round(round)[1])
        key = self._averaged(device_id, round)
        if key is not None:
            arrays.update(self.weights[key])
        return Payload(arrays)

    def expected_uplink(self, device_id: str) -> dict[str, ArraySpec]:
        """Checked by the round loop before aggregate: knowledge dtypes and shapes, and this
        device's weights."""
        c = self.ctx.num_classes
        out = {"logit": array_spec(np.float32, (c, c)), "count": array_spec(np.int64, (c,))}
        if self.features is not None:
            out["feat"] = array_spec(np.float32, (c, self.feature_dim))
        out.update(self.point_specs())
        key = self._averaged(device_id)
        if key is not None:
            out.update({k: spec_of(v) for k, v in self.weights[key].items()})
        return out

    def point_specs(self) -> dict[str, ArraySpec]:
        """Feature points an uplink carries besides the knowledge: none (Velo's: some)."""
        return {}

    def _valid(self, device_id: str, p: Payload) -> bool:
        c = self.ctx.num_classes
        shapes = {"logit": (c, c), "count": (c,)}
        if self.features is not None:
            shapes["feat"] = (c, self.feature_dim)
        for name, shape in shapes.items():
            if name not in p.arrays or np.shape(p.arrays[name]) != shape:
                log.warning(
                    "ignoring the knowledge of %s: %s missing or not of shape %s",
                    device_id,
                    name,
                    shape,
                )
                return False
        return True

    def aggregate(self, round: int, uplinks: Mapping[str, Payload]) -> dict[str, float]:
        defences = defences_of(self.options)
        valid = {d: p for d, p in sorted(uplinks.items()) if self._valid(d, p)}
        # the norm bound: each uploaded class vector at most clip_norm from the class's value
        # before this round (from 0 while the class has none)
        before = self._round(round)[1] if defences.clip_norm > 0 else {}
        self._round_cache = None  # the knowledge changes now

        def bounded(name: str, c: int, vector: np.ndarray) -> np.ndarray:
            if defences.clip_norm <= 0:
                return vector
            ref = before[name][c] if before["known"][c] else None
            return clip_to_norm(vector, ref, defences.clip_norm)

        for p in valid.values():
            count = np.asarray(p.arrays["count"])
            for c in np.flatnonzero(count > 0):
                self.logits.add(int(c), bounded("logit", c, p.arrays["logit"][c]), float(count[c]))
                if self.features is not None:
                    self.features.add(
                        int(c), bounded("feat", c, p.arrays["feat"][c]), float(count[c])
                    )
            self.absorb(p)
        metrics = {"known_classes": float(self.logits.known().sum())}
        if self.options.shares_weights:
            groups: dict[str, list[Payload]] = {}
            for d, p in valid.items():
                if any(k.startswith(WEIGHTS) for k in p.arrays):
                    groups.setdefault(self._architecture(self.ctx.fleet[d].spec), []).append(p)
            for key, members in groups.items():
                items = [
                    (
                        {k: v for k, v in p.arrays.items() if k.startswith(WEIGHTS)},
                        float(p.meta["num_samples"]),
                    )
                    for p in members
                ]
                if defences.clip_norm > 0:
                    items = [
                        (clip_update(a, self.weights[key], defences.clip_norm), w) for a, w in items
                    ]
                averaged = robust_average(items, defences.aggregator, defences.trim)
                self.weights[key] = self.server_opt.step(
                    key, self.weights[key], averaged, self.trainable[key]
                )
            metrics["architectures_averaged"] = float(len(groups))
        return metrics

    def absorb(self, payload: Payload) -> None:  # noqa: B027 - hook for Velo
        """Fold whatever else a valid uplink carries into the server state."""

    def state_dict(self) -> dict[str, np.ndarray]:
        out = self.logits.state("logit/")
        if self.features is not None:
            out.update(self.features.state("feat/"))
        for key, arrays in self.weights.items():
            out.update({f"arch|{key}|{name}": v for name, v in arrays.items()})
        out.update(self.server_opt.state_dict())
        return out

    def load_state_dict(self, arrays: Mapping[str, np.ndarray]) -> None:
        self._round_cache = None
        self.logits.load(arrays, "logit/")
        if self.features is not None:
            self.features.load(arrays, "feat/")
        weights: dict[str, dict[str, np.ndarray]] = {}
        for k, v in arrays.items():
            if k.startswith("arch|"):
                _, key, name = k.split("|", 2)
                weights.setdefault(key, {})[name] = np.array(v)
        self.weights.update(weights)
        self.server_opt.load_state_dict(arrays)


class FeloServer(FedHeServer):
    """Felo's server: FedHe's plus per-class features, and per-architecture FedAvg when the
    options share weights."""

    shares_features = True

    def __init__(self, ctx, options: FeloOptions):
        super().__init__(ctx, options)
        self.options: FeloOptions = options
