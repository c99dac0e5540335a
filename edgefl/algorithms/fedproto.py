"""FedProto (Tan et al., AAAI 2022): devices share class prototypes, not weights.

A prototype c_k^y is the mean feature ``model.features(x)`` of device k's samples of class y.
Every architecture of the fleet must produce features of one common dimension (set
``feature_dim``; the zoo adds a projection), so heterogeneous models can share them.

Device: L = CE(f_k(x), y) + λ·MSE(g_k(x), c^y) over the samples whose class has a global
prototype (no term before the first aggregation). After local training the device computes its
prototypes in eval mode over all its data and uploads those of the classes it holds.

Server: c^y = unweighted mean of the uploaded c_k^y over the devices that hold y (as the
authors' ``proto_aggregation``; the paper's text weights by sample counts). A class that no
device reported this round keeps its previous prototype. Downlink: the prototypes of the
classes the device holds (learned from its uplinks; a device not heard from yet gets all known
prototypes), which is all its loss uses.

Payload keys (shared with FedVTC): ``proto`` float32 [n, p] and ``proto_classes`` int64 [n].

Options: ``lam`` (λ, default 1.0 as the authors' code), ``full_last_rounds`` (the last N
training rounds select every device — FedVTC's paper gives its baselines extra
full-participation rounds in place of FedVTC's fine-tuning phase).

Our choices: prototypes in eval mode after training (the authors average train-mode batch
features during the last epoch); evaluation uses the model's own head.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from edgefl.algorithms.aggregate import Defences, clip_to_norm, defences_of, robust_stack
from edgefl.algorithms.base import Algorithm, DeviceHalf, ServerHalf, register
from edgefl.algorithms.training import train_round
from edgefl.data import ArrayDataset
from edgefl.errors import ConfigError
from edgefl.privacy import ClassStats, Release
from edgefl.wire import ArraySpec, Payload, array_spec

log = logging.getLogger(__name__)

PROTO = "proto"
PROTO_CLASSES = "proto_classes"


# -- prototypes on the device -------------------------------------------------------------------
@torch.no_grad()
def local_prototypes(
    model: torch.nn.Module, data: ArrayDataset, batch_size: int = 256
) -> dict[int, np.ndarray]:
    """{class: mean feature} over ``data`` with the model in eval mode (float64 sums)."""
    was_training = model.training
    model.eval()
    sums: dict[int, torch.Tensor] = {}
    counts: dict[int, int] = {}
    for x, y in data.batches(batch_size, shuffle=False):
        z = model.features(x).double()
        for c in torch.unique(y).tolist():
            rows = z[y == c]
            sums[c] = sums.get(c, 0) + rows.sum(0)
            counts[c] = counts.get(c, 0) + len(rows)
    model.train(was_training)
    return {c: (sums[c] / counts[c]).float().cpu().numpy() for c in sorted(sums)}


def pack_prototypes(protos: Mapping[int, np.ndarray]) -> dict[str, np.ndarray]:
    classes = sorted(protos)
    if not classes:
        return {}
    return {
        PROTO: np.stack([np.asarray(protos[c], np.float32) for c in classes]),
        PROTO_CLASSES: np.asarray(classes, np.int64),
    }


def prototype_specs(dim: int) -> dict[str, ArraySpec]:
    """A downlink's prototypes (:func:`pack_prototypes`): absent before any class has one."""
    return {
        PROTO: array_spec(np.float32, (None, dim), "prototypes"),
        PROTO_CLASSES: array_spec(np.int64, (None,), "prototypes"),
    }


def unpack_prototypes(
    arrays: Mapping[str, np.ndarray], num_classes: int, dim: int
) -> dict[int, np.ndarray]:
    """The inverse of :func:`pack_prototypes`, checking classes and shapes (it came over the
    wire)."""
    if PROTO not in arrays:
        return {}
    protos, classes = (
        np.asarray(arrays[PROTO]),
        np.asarray(arrays.get(PROTO_CLASSES, np.zeros(0, np.int64))),
    )
    if protos.ndim != 2 or protos.shape[1] != dim or classes.shape != (protos.shape[0],):
        raise ConfigError(
            f"prototypes of shape {protos.shape} with {classes.shape} classes; expected [n, "
            f"{dim}] and [n]"
        )
    if len(classes) and (
        classes.min() < 0
        or classes.max() >= num_classes
        or len(set(classes.tolist())) != len(classes)
    ):
        raise ConfigError(
            f"prototype classes {classes.tolist()} are not distinct classes of 0..{num_classes - 1}"
        )
    return {int(c): protos[i] for i, c in enumerate(classes)}


class PrototypeTable:
    """Global prototypes [C, p] with a mask of the classes some device has reported."""

    def __init__(self, num_classes: int, dim: int):
        self.num_classes, self.dim = num_classes, dim
        self.values = np.zeros((num_classes, dim), np.float32)
        self.known = np.zeros(num_classes, bool)

    def aggregate(
        self, uploads: Sequence[Mapping[int, np.ndarray]], defences: Defences = Defences()
    ) -> int:
        """c^y = unweighted mean over the uploads holding y (or the defences' robust rule, after
        bounding each upload's distance from the current c^y); returns how many classes were
        updated."""
        per_class: dict[int, list[np.ndarray]] = {}
        for protos in uploads:
            for c, v in protos.items():
                ref = self.values[c] if self.known[c] else None
                per_class.setdefault(c, []).append(
                    clip_to_norm(v, ref, defences.clip_norm) if defences.clip_norm > 0 else v
                )
        for c, vectors in per_class.items():
            self.values[c] = robust_stack(vectors, defences.aggregator, defences.trim).astype(
                np.float32
            )
            self.known[c] = True
        return len(per_class)

    def select(self, classes: Sequence[int] | None) -> dict[int, np.ndarray]:
        """The known prototypes of ``classes`` (all known ones for None)."""
        wanted = range(self.num_classes) if classes is None else classes
        return {int(c): self.values[c] for c in wanted if self.known[c]}

    def state(self, prefix: str = "table/") -> dict[str, np.ndarray]:
        return {prefix + "values": self.values.copy(), prefix + "known": self.known.copy()}

    def load(self, arrays: Mapping[str, np.ndarray], prefix: str = "table/") -> None:
        if prefix + "values" in arrays:
            self.values = np.array(arrays[prefix + "values"], np.float32)
            self.known = np.array(arrays[prefix + "known"], bool)


def fleet_feature_dim(ctx, method: str) -> int:
    dims = {s.feature_dim for s in ctx.specs()}
    if len(dims) != 1 or None in dims:
        raise ConfigError(
            f"{method} shares features across the fleet: set one feature_dim for every model (got "
            f"{sorted(map(str, dims))})"
        )
    return int(dims.pop())


class PrototypeServer(ServerHalf):
    """Averages prototypes per class; remembers which classes each device holds."""

    method = "fedproto"

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.dim = fleet_feature_dim(ctx, self.method)
        self.table = PrototypeTable(ctx.num_classes, self.dim)
        self.device_classes: dict[str, list[int]] = {}

    def prototype_downlink(self, device_id: str) -> dict[str, np.ndarray]:
        return pack_prototypes(self.table.select(self.device_classes.get(device_id)))

    def downlink(self, round: int, device_id: str) -> Payload:
        return Payload(self.prototype_downlink(device_id))

    def expected_uplink(self, device_id: str) -> dict[str, ArraySpec]:
        # [n, p] and [n]: n = the classes it holds
        return {
            PROTO: array_spec(np.float32, (None, self.dim)),
            PROTO_CLASSES: array_spec(np.int64, (None,)),
        }

    def aggregate_prototypes(self, uplinks: Mapping[str, Payload]) -> dict[str, float]:
        uploads = {}
        for d, p in uplinks.items():
            try:
                uploads[d] = unpack_prototypes(p.arrays, self.ctx.num_classes, self.dim)
            except ConfigError as e:  # a bad uplink is skipped, never fatal
                log.warning("%s: ignoring the prototypes of %s: %s", self.method, d, e)
                continue
            if uploads[d]:
                self.device_classes[d] = sorted(uploads[d])
        updated = self.table.aggregate(list(uploads.values()), defences_of(self.options))
        return {"classes_updated": float(updated), "classes_known": float(self.table.known.sum())}

    def aggregate(self, round: int, uplinks: Mapping[str, Payload]) -> dict[str, float]:
        return self.aggregate_prototypes(uplinks)

    def state_dict(self) -> dict[str, np.ndarray]:
        out = self.table.state()
        for d, classes in self.device_classes.items():
            mask = np.zeros(self.ctx.num_classes, bool)
            mask[classes] = True
            out[f"classes/{d}"] = mask
        return out

    def load_state_dict(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.table.load(arrays)
        self.device_classes = {
            k.removeprefix("classes/"): np.flatnonzero(v).tolist()
            for k, v in arrays.items()
            if k.startswith("classes/")
        }


# -- FedProto itself ----------------------------------------------------------------------------
@dataclass(frozen=True)
class FedProtoOptions(Defences):
    lam: float = 1.0
    full_last_rounds: int = 0

    def __post_init__(self):
        super().__post_init__()
        if self.lam < 0:
            raise ValueError("lam must be >= 0")
        if self.full_last_rounds < 0:
            raise ValueError("full_last_rounds must be >= 0")


class FedProtoServer(PrototypeServer):
    """FedProto's server: the prototype averaging, and every device in the last
    ``full_last_rounds`` training rounds."""

    def __init__(self, ctx, options: FedProtoOptions):
        super().__init__(ctx, options)
        self.options: FedProtoOptions = options

    def select(self, round: int, device_ids: Sequence[str], rng: np.random.Generator) -> list[str]:
        if round >= self.ctx.rounds - self.options.full_last_rounds:
            return sorted(device_ids)
        return super().select(round, device_ids, rng)


def prototype_loss(
    z: torch.Tensor, y: torch.Tensor, protos: torch.Tensor, known: torch.Tensor
) -> torch.Tensor:
    """MSE (mean over elements) between features and the global prototype of their class, over
    the samples whose class has one; 0 when none has."""
    rows = known[y]
    if not bool(rows.any()):
        return z.sum() * 0.0
    return F.mse_loss(z[rows], protos[y[rows]])


class FedProtoDevice(DeviceHalf):
    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        dim = ctx.spec.feature_dim
        if dim is None:
            raise ConfigError(
                "fedproto needs a common feature_dim across the fleet (e.g. --feature-dim 980)"
            )
        self.protos = torch.zeros(ctx.num_classes, dim, device=self.device)
        self.known = torch.zeros(ctx.num_classes, dtype=torch.bool, device=self.device)

    def expected_downlink(self) -> dict[str, ArraySpec]:
        return prototype_specs(self.protos.shape[1])

    def receive(self, round: int, payload: Payload) -> None:
        for c, v in unpack_prototypes(
            payload.arrays, self.ctx.num_classes, self.protos.shape[1]
        ).items():
            self.protos[c] = torch.tensor(
                np.asarray(v), dtype=torch.float32, device=self.device
            )
            self.known[c] = True

    @classmethod
    def privacy_release(cls, options) -> Release:
        """Per-class mean features of the classes it reports (no counts travel)."""
        return Release(stats=ClassStats((PROTO,), reduce="mean", classes=PROTO_CLASSES))

    def sample_vectors(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {PROTO: self.model.features(x)}

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = self.model.features(x)
        ce = F.cross_entropy(self.model.classify(z), y)
        if self.options.lam == 0:
            return ce
        return ce + self.options.lam * prototype_loss(z, y, self.protos, self.known)

    def fit(self, round: int) -> Payload:
        meta = train_round(self, round, self.loss)
        protos = local_prototypes(self.model, self.ctx.train_data)
        return Payload(pack_prototypes(protos), meta)


#: The FedVTC paper's fleet at CPU size: FedHeNN's five CNNs with the common latent p = 980
#: (Fashion-MNIST/MNIST; use 4096 for 32×32 RGB), batch 16, SGD lr 0.01 (see fedvtc.py).
PROTOTYPE_DEFAULTS = {
    "model": "cnn",
    "tiers": ("1", "2", "3", "4", "5"),
    "width": 0.5,
    "feature_dim": 980,
    "fraction": 0.3,
    "optimizer": "sgd",
    "lr": 0.01,
    "batch_size": 16,
    "epochs": 1,
}

register(
    Algorithm(
        name="fedproto",
        description="FedProto: share per-class prototypes; regularise local features towards the "
        "global ones",
        device=FedProtoDevice,
        server=FedProtoServer,
        options=FedProtoOptions,
        defaults=PROTOTYPE_DEFAULTS,
    )
)
