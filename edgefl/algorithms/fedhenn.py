"""FedHeNN (Makhija et al.): heterogeneous models aligned by the CKA of their representations.

Device objective (each minibatch)::

    L = CE(model(x), y) + η_t·(1 − CKA(K(Z_local), K̄)),   η_t = η₀·√t,   η = 0 until a K̄ exists

with Z_local = model.features(RAD) (the penultimate representation, N×d; d may differ per
device) forwarded on the round's alignment set (RAD) at every minibatch, in train mode as the
authors' code does (``rad_mode``).

What travels (heterogeneous variant, the default). Weights stay on the device:

- The server holds an unlabelled public pool (its declared ``MethodNeeds.public_share``: the run
  assembly carves a stratified 2% of the training set, removed from device data; labels are never
  used). RAD_t = ``rad_size`` samples drawn from the pool with the run seed and round t.
- Downlink of round t: ``rad/x`` = RAD_t images (uint8) with ``rad/kbar`` = K̄_t (N×N), and
  ``probe/x`` = RAD_{t+1} images.
- The device trains aligning to K̄_t on RAD_t, then publishes ``z`` = its eval-mode
  representation of RAD_{t+1} (with its new weights W^t).
- The server forms K_i = K(Z_i) on RAD_{t+1}, averages them (uniform over the round's uplinks,
  or weighted by sample count) into K̄_{t+1} and sends it next round with RAD_{t+1}.

So the kernel a device aligns to is always computed on exactly the samples, in the same order, that
the device forwards; this is the paper's K̄ = Σ wᵢ·Kᵢ(Wᵢ^{t−1}) on the round's RAD. The price of
keeping weights on the device is a second image set in the downlink. If nobody reported in round
t−1 there is no K̄_t on RAD_t, and round t trains with η = 0 (never a kernel on other samples).
K̄ is scaled to max |K̄| = 1 before it is sent (CKA ignores positive scale), which makes the
float16 option (``kbar_float16``, default on) safe.

``rad_source=device``: the devices hold the same pool (``DeviceContext.public``) and the
downlink carries ``rad/idx`` / ``probe/idx`` (int64 indices into it) instead of images.

``variant=homo`` (one architecture): devices upload weights; the server averages them (FedAvg,
weighted by data size) into a global model and sends it with RAD_t; each device computes
K̄ = K(global model, RAD_t) itself (eval mode, once per round: the global model is frozen during
the round) and keeps training its own personal model.

Options (``-o key=value``): ``eta0=0.01`` (code), ``rad_size=1000`` (code; the paper used 5000;
clipped to the pool size), ``kernel=linear|rbf`` with ``rbf_scale=1``, ``kbar_float16=true``,
``z_float16=false``, ``weights=uniform|samples``, ``variant=hetero|homo``,
``rad_source=server|device``, ``rad_mode=train|eval``.
Our choices (the paper leaves them open): the held-out pool, the two-set downlink, K̄
normalisation, eval-mode Z for the uplink, η counted from round 0 (so √t is 0 in round 0).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from edgefl.algorithms.base import Algorithm, DeviceHalf, MethodNeeds, ServerHalf, register
from edgefl.algorithms.cka import KernelTarget, kernel
from edgefl.algorithms.fedavg import WEIGHTS, GlobalModelServer
from edgefl.algorithms.training import train_round
from edgefl.data import ArrayDataset
from edgefl.errors import ConfigError
from edgefl.models import build_model
from edgefl.privacy import Release
from edgefl.wire import ArraySpec, Payload, array_spec, arrays_to_state, state_to_arrays

RAD_X, RAD_IDX, KBAR = "rad/x", "rad/idx", "rad/kbar"
PROBE_X, PROBE_IDX = "probe/x", "probe/idx"
Z = "z"


@dataclass(frozen=True)
class FedHeNNOptions:
    eta0: float = 0.01
    rad_size: int = 1000
    kernel: Literal["linear", "rbf"] = "linear"
    rbf_scale: float = 1.0
    kbar_float16: bool = True
    z_float16: bool = False
    weights: Literal["uniform", "samples"] = "uniform"
    variant: Literal["hetero", "homo"] = "hetero"
    rad_source: Literal["server", "device"] = "server"
    rad_mode: Literal["train", "eval"] = "train"

    def __post_init__(self):
        if self.eta0 < 0:
            raise ValueError("eta0 must be >= 0")
        if self.rad_size < 2:
            raise ValueError("rad_size must be >= 2")
        if self.rbf_scale <= 0:
            raise ValueError("rbf_scale must be > 0")

    def eta_at(self, round: int) -> float:
        """η_t = η₀·√t (the device uses 0 while it has no K̄)."""
        return self.eta0 * math.sqrt(max(round, 0))


def rad_indices(seed: int, round: int, pool_size: int, size: int) -> np.ndarray:
    """RAD_t: ``size`` distinct pool indices, drawn from (run seed, round) — reproducible
    anywhere."""
    rng = np.random.default_rng([seed, round, 4242])
    return np.sort(rng.choice(pool_size, size=min(size, pool_size), replace=False)).astype(np.int64)


def images_to_float(x: np.ndarray) -> torch.Tensor:
    if x.dtype != np.uint8:
        raise ValueError(f"alignment images must be uint8, got {x.dtype}")
    # a float copy (a received array is a read-only view; torch.from_numpy would warn about it)
    return torch.tensor(x, dtype=torch.float32).div_(255.0)


class FedHeNNDevice(DeviceHalf):
    def __init__(self, ctx, options: FedHeNNOptions):
        super().__init__(ctx, options)
        self.rad: torch.Tensor | None = None  # images of RAD_t (the alignment set)
        self.target: KernelTarget | None = None  # K̄_t prepared for CKA
        self.probe: torch.Tensor | None = None  # images of RAD_{t+1} (hetero: publish Z on them)
        self.global_model = None
        if options.variant == "homo":
            self.global_model = build_model(ctx.spec).to(self.device)
            self.global_model.eval()

    # -- downlink -------------------------------------------------------------------------------
    def _images(self, payload: Payload, x_key: str, idx_key: str) -> torch.Tensor | None:
        if x_key in payload.arrays:
            x = images_to_float(np.asarray(payload.arrays[x_key])).to(self.device)
            if tuple(x.shape[1:]) != tuple(self.ctx.spec.in_shape):
                raise ValueError(
                    f"{x_key} has shape {tuple(x.shape)}, expected [N, {self.ctx.spec.in_shape}]"
                )
            return x
        if idx_key in payload.arrays:
            pool = self.ctx.public
            if pool is None:
                raise ConfigError(
                    "rad_source=device needs the alignment pool on the device "
                    "(DeviceContext.public)"
                )
            idx = np.asarray(payload.arrays[idx_key]).astype(np.int64)
            if idx.ndim != 1 or (idx.size and (idx.min() < 0 or idx.max() >= len(pool))):
                raise ValueError(f"{idx_key} indexes outside the device's pool of {len(pool)}")
            return pool.images(idx)
        return None

    def expected_downlink(self) -> dict[str, ArraySpec]:
        """Hetero: the probe set every round, and RAD_t with K̄_t once a K̄ exists (group "rad").
        Homo: the global model and RAD_t every round. Sets travel as images, or as indices
        into the pool the devices hold (``rad_source=device``)."""
        o: FedHeNNOptions = self.options

        def images(x_key: str, idx_key: str, group: str | None) -> dict[str, ArraySpec]:
            if o.rad_source == "device":
                return {idx_key: array_spec(np.int64, (None,), group)}
            return {x_key: array_spec(np.uint8, (None, *self.ctx.spec.in_shape), group)}

        if o.variant == "homo":
            return {**self.weight_specs(WEIGHTS), **images(RAD_X, RAD_IDX, None)}
        kbar = array_spec(np.float16 if o.kbar_float16 else np.float32, (None, None), "rad")
        return {**images(PROBE_X, PROBE_IDX, None), **images(RAD_X, RAD_IDX, "rad"), KBAR: kbar}

    def receive(self, round: int, payload: Payload) -> None:
        o: FedHeNNOptions = self.options
        self.rad = self._images(payload, RAD_X, RAD_IDX)
        self.probe = self._images(payload, PROBE_X, PROBE_IDX)
        self.target = None
        if o.variant == "homo":
            state = arrays_to_state(payload.arrays, WEIGHTS)
            if state:
                self.global_model.load_state_dict(state, strict=True)
            if self.rad is not None:
                with torch.no_grad():
                    self.target = KernelTarget(
                        kernel(self.global_model.features(self.rad), o.kernel, o.rbf_scale),
                        o.kernel,
                        o.rbf_scale,
                    )
        elif KBAR in payload.arrays and self.rad is not None:
            kbar = torch.from_numpy(np.asarray(payload.arrays[KBAR], np.float32).copy())
            kbar = kbar.to(self.device)
            n = self.rad.shape[0]
            if tuple(kbar.shape) != (n, n):
                raise ValueError(f"K̄ has shape {tuple(kbar.shape)}, but the RAD has {n} samples")
            self.target = KernelTarget(kbar, o.kernel, o.rbf_scale)

    # -- local work -----------------------------------------------------------------------------
    def eta(self, round: int) -> float:
        return self.options.eta_at(round) if self.target is not None else 0.0

    def alignment(self) -> float | None:
        """CKA(K(model, RAD_t), K̄_t) in eval mode; None without a K̄."""
        if self.target is None:
            return None
        was = self.model.training
        self.model.eval()
        with torch.no_grad():
            value = float(self.target.cka(self.model.features(self.rad)))
        self.model.train(was)
        return value

    def loss_fn(self, round: int):
        eta, target, rad, model = self.eta(round), self.target, self.rad, self.model
        if eta == 0:
            return None
        eval_mode = self.options.rad_mode == "eval"

        def loss(x, y):
            ce = F.cross_entropy(model(x), y)
            if eval_mode:
                model.eval()
            z = model.features(rad)
            if eval_mode:
                model.train()
            return ce + eta * (1.0 - target.cka(z))

        return loss

    @classmethod
    def privacy_release(cls, options) -> Release:
        """The weights (variant homo), else the representation matrix of the public images,
        clipped as one vector (it depends on the device's data through the trained weights)."""
        if options.variant == "homo":
            return Release(whole=(WEIGHTS,))
        return Release(whole=(Z,), reference="zero")

    def fit(self, round: int) -> Payload:
        o: FedHeNNOptions = self.options
        before = self.alignment()
        meta = train_round(self, round, self.loss_fn(round))
        meta["eta"] = self.eta(round)
        after = self.alignment()
        if after is not None:
            meta["cka_before"], meta["cka_after"] = before, after
        arrays: dict[str, np.ndarray] = {}
        if o.variant == "homo":
            arrays = state_to_arrays(self.model.state_dict(), WEIGHTS)
        elif self.probe is not None:
            self.model.eval()
            with torch.no_grad():
                z = self.model.features(self.probe).flatten(1).cpu().numpy()
            self.model.train()
            arrays[Z] = z.astype(np.float16 if o.z_float16 else np.float32)
        return Payload(arrays, meta)


class FedHeNNServer(ServerHalf):
    def __init__(self, ctx, options: FedHeNNOptions):
        super().__init__(ctx, options)
        if ctx.public is None or len(ctx.public) < 2:
            raise ConfigError(
                "fedhenn needs an unlabelled alignment pool: set public_fraction > 0 (default 0.02)"
            )
        self.pool: ArrayDataset = ctx.public
        self.kbar: np.ndarray | None = None
        self.kbar_round = -1  # the round whose RAD K̄ was computed on
        self._rad: dict[int, np.ndarray] = {}
        self._images: dict[bytes, np.ndarray] = {}  # RAD or probe indices → their images
        self.global_server = GlobalModelServer(ctx, options) if options.variant == "homo" else None

    def rad(self, round: int) -> np.ndarray:
        """The round's RAD indices (the same for every device: drawn once per round)."""
        if round not in self._rad:
            if len(self._rad) > 4:
                self._rad.pop(min(self._rad))
            self._rad[round] = rad_indices(
                self.ctx.seed, round, len(self.pool), self.options.rad_size
            )
        return self._rad[round]

    def _set(self, arrays: dict, x_key: str, idx_key: str, idx: np.ndarray) -> None:
        if self.options.rad_source == "device":
            arrays[idx_key] = idx
            return
        key = idx.tobytes()  # the same images for every device of the round: gathered once
        if key not in self._images:
            if len(self._images) >= 4:
                self._images.pop(next(iter(self._images)))
            self._images[key] = self.pool.x[torch.from_numpy(idx)].numpy()
        arrays[x_key] = self._images[key]

    def downlink(self, round: int, device_id: str) -> Payload:
        arrays: dict[str, np.ndarray] = {}
        if self.global_server is not None:
            arrays.update(self.global_server.downlink(round, device_id).arrays)
            self._set(arrays, RAD_X, RAD_IDX, self.rad(round))
            return Payload(arrays)
        if self.kbar is not None and self.kbar_round == round:
            self._set(arrays, RAD_X, RAD_IDX, self.rad(round))
            arrays[KBAR] = self.kbar.astype(np.float16 if self.options.kbar_float16 else np.float32)
        self._set(arrays, PROBE_X, PROBE_IDX, self.rad(round + 1))
        return Payload(arrays)

    def aggregate(self, round: int, uplinks: Mapping[str, Payload]) -> dict[str, float]:
        o: FedHeNNOptions = self.options
        metrics: dict[str, float] = {}
        cka = [float(p.meta["cka_after"]) for p in uplinks.values() if "cka_after" in p.meta]
        if cka:
            # the devices' alignment with K̄ after their training
            metrics["cka_mean"] = float(np.mean(cka))
            before = [
                float(p.meta["cka_before"]) for p in uplinks.values() if "cka_before" in p.meta
            ]
            # and before it: what the round's η moved
            metrics["cka_before_mean"] = float(np.mean(before))
        if self.global_server is not None:
            self.global_server.aggregate(round, uplinks)
            return metrics
        n = len(self.rad(round + 1))
        total, weight = None, 0.0
        for p in uplinks.values():
            if Z not in p.arrays:
                continue
            z = np.asarray(p.arrays[Z], np.float64)
            if z.ndim < 2 or z.shape[0] != n:
                continue  # a representation of other samples cannot enter this kernel
            k = kernel(torch.from_numpy(z), o.kernel, o.rbf_scale).numpy()
            w = 1.0 if o.weights == "uniform" else float(p.meta.get("num_samples", 1.0))
            total = w * k if total is None else total + w * k
            weight += w
        if total is None or weight <= 0:
            self.kbar, self.kbar_round = None, -1
            return metrics
        kbar = total / weight
        self.kbar = kbar / max(float(np.abs(kbar).max()), 1e-12)  # CKA is scale-free; float16-safe
        self.kbar_round = round + 1
        metrics["kbar_devices"] = float(sum(Z in p.arrays for p in uplinks.values()))
        return metrics

    def expected_uplink(self, device_id: str):
        if self.global_server is not None:
            return self.global_server.expected_uplink(device_id)
        dtype = np.float16 if self.options.z_float16 else np.float32
        # N×d, d per architecture; aggregate skips a Z of the wrong N
        return {Z: array_spec(dtype, (None, None))}

    def state_dict(self) -> dict[str, np.ndarray]:
        out = {"kbar_round": np.array(self.kbar_round, np.int64)}
        if self.kbar is not None:
            out["kbar"] = self.kbar
        if self.global_server is not None:
            out.update(self.global_server.state_dict())
        return out

    def load_state_dict(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.kbar_round = int(arrays["kbar_round"])
        self.kbar = np.array(arrays["kbar"]) if "kbar" in arrays else None
        if self.global_server is not None:
            self.global_server.load_state_dict(arrays)


#: A heterogeneous fleet of FedHeNN's five CNNs; the code's SGD lr 0.01, momentum 0.5,
#: weight decay 1e-4, batch 10 (epochs: use ``--steps`` for CPU-sized runs).
PAPER_DEFAULTS = {
    "model": "cnn",
    "tiers": ("1", "2", "3", "4", "5"),
    "optimizer": "sgd",
    "lr": 0.01,
    "momentum": 0.5,
    "weight_decay": 1e-4,
    "batch_size": 10,
    "epochs": 1,
}


def alignment_pool(options: FedHeNNOptions) -> MethodNeeds:
    """An unlabelled 2 % alignment pool; with ``rad_source=device`` every device holds it too."""
    return MethodNeeds(public_share=0.02, public_use="alignment",
                       devices_hold_public=options.rad_source == "device")


register(
    Algorithm(
        name="fedhenn",
        description="FedHeNN: heterogeneous models aligned by CKA of their representations on a "
        "public alignment set",
        device=FedHeNNDevice,
        server=FedHeNNServer,
        options=FedHeNNOptions,
        defaults=PAPER_DEFAULTS,
        needs=alignment_pool,
    )
)
