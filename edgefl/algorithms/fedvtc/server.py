"""FedVTC's server half (:mod:`edgefl.algorithms.fedvtc`): FedProto's prototype averaging plus σ,
the one-shot average of the devices' decoders ψ_k after training, and the oracle's verdict on
ψ's samples. The derivation: docs/methods/fedvtc.md."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from edgefl.algorithms.aggregate import weighted_average
from edgefl.algorithms.fedproto import PrototypeServer, pack_prototypes
from edgefl.algorithms.fedvtc.options import FedVTCOptions
from edgefl.algorithms.fedvtc.vtc import (
    PSI,
    SIGMA,
    build_decoder,
    generate,
    load_decoder,
    save_generator,
    vtc_layout,
)
from edgefl.errors import ConfigError
from edgefl.models import ModelSpec
from edgefl.wire import ArraySpec, Payload, array_spec, state_to_arrays

log = logging.getLogger(__name__)


class FedVTCServer(PrototypeServer):
    method = "fedvtc"

    def __init__(self, ctx, options: FedVTCOptions):
        super().__init__(ctx, options)
        shapes = {s.in_shape for s in ctx.specs()}
        if len(shapes) != 1:
            raise ConfigError(
                "fedvtc averages one decoder: every model needs the same input shape "
                f"(got {sorted(shapes)})"
            )
        self.layout = vtc_layout(ctx.specs()[0], options.vtc_channels)
        if options.vtc_seed is not None:
            self.vtc_seed = int(options.vtc_seed)
        else:
            self.vtc_seed = int(np.random.default_rng([ctx.seed, 0x7C]).integers(2**31))
        # None until the devices' σ is averaged when they measure it from their data
        self.sigma = (
            None
            if options.init_sigma is None
            else np.full(self.layout.dim, options.init_sigma, np.float32)
        )
        self.oracle = (
            load_oracle(options.oracle, ctx.specs()[0], ctx.num_classes) if options.oracle else None
        )
        reference = state_to_arrays(build_decoder(self.layout, self.vtc_seed).state_dict(), PSI)
        self.psi_shapes = {k: (v.shape, v.dtype) for k, v in reference.items()}
        self.psi: dict[str, np.ndarray] | None = reference if options.psi_every_round else None

    @property
    def final_round(self) -> int:
        return self.ctx.total_rounds

    def select(self, round: int, device_ids: Sequence[str], rng: np.random.Generator) -> list[str]:
        if round >= self.ctx.rounds:  # the closing round: every device uploads ψ_k
            return sorted(device_ids)
        return super().select(round, device_ids, rng)

    def expected_uplink(self, device_id: str) -> dict[str, ArraySpec]:
        # 0-d tensors (BN's num_batches_tracked) may arrive as [1]: any shape, sizes checked later
        psi = {k: array_spec(dt, s if len(s) else None) for k, (s, dt) in self.psi_shapes.items()}
        if self.ctx.round >= self.ctx.rounds:  # the loop's round in progress
            return psi
        train = {
            **super().expected_uplink(device_id),
            SIGMA: array_spec(np.float32, (self.layout.dim,)),
        }
        return {**train, **psi} if self.options.psi_every_round else train

    def downlink(self, round: int, device_id: str) -> Payload:
        meta = {"vtc_seed": self.vtc_seed}
        if round >= self.final_round:
            arrays = {
                **pack_prototypes(self.table.select(None)),
                **self.sigma_arrays(),
                **(self.psi or {}),
            }
            return Payload(arrays, {**meta, "phase": "final"})
        if round >= self.ctx.rounds:
            return Payload({}, {**meta, "phase": "upload_psi"})
        arrays = {**self.prototype_downlink(device_id), **self.sigma_arrays()}
        if self.options.psi_every_round:
            arrays.update(self.psi)
        return Payload(arrays, {**meta, "phase": "train"})

    def sigma_arrays(self) -> dict[str, np.ndarray]:
        return {} if self.sigma is None else {SIGMA: self.sigma.copy()}

    def valid_psi(self, device_id: str, payload: Payload) -> dict[str, np.ndarray] | None:
        arrays = {k: v for k, v in payload.arrays.items() if k.startswith(PSI)}
        # sizes, not shapes: the wire carries 0-d tensors (BN's num_batches_tracked) as [1]
        sizes = {k: (v.size, v.dtype) for k, v in arrays.items()}
        if sizes != {k: (math.prod(s), dt) for k, (s, dt) in self.psi_shapes.items()}:
            log.warning(
                "fedvtc: ignoring the decoder from %s: its tensors do not match the fleet's "
                "decoder",
                device_id,
            )
            return None
        return {k: v.reshape(self.psi_shapes[k][0]) for k, v in arrays.items()}

    def average_psi(self, uplinks: Mapping[str, Payload]) -> int:
        """ψ = parameter-wise unweighted mean of the valid uploads; returns how many were used."""
        valid = [a for d, p in uplinks.items() if (a := self.valid_psi(d, p)) is not None]
        if valid:
            self.psi = weighted_average((a, 1.0) for a in valid)
            if self.options.psi_bn == "recalibrate":
                self.psi = self.recalibrated_psi(self.psi)
        return len(valid)

    @torch.no_grad()
    def recalibrated_psi(
        self, arrays: Mapping[str, np.ndarray], batches: int = 20, per_class: int = 20
    ) -> dict[str, np.ndarray]:
        """``arrays`` with ψ's BatchNorm running statistics re-estimated on ``batches`` batches of
        latents v ~ N(c^y, diag σ²), ``per_class`` per known class (a cumulative average)."""
        if self.sigma is None or not self.table.known.any():
            return dict(arrays)
        psi = load_decoder(self.layout, arrays)
        for m in psi.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.reset_running_stats()
                m.momentum = None  # the plain mean over the batches
        psi.train()
        classes = np.flatnonzero(self.table.known).tolist()
        noise = torch.Generator().manual_seed(int(self.ctx.rng(self.ctx.round, 6).integers(2**31)))
        protos, sigma = (
            torch.from_numpy(self.table.values.astype(np.float32)),
            torch.from_numpy(self.sigma),
        )
        y = torch.tensor(classes, dtype=torch.int64).repeat_interleave(per_class)
        for _ in range(batches):
            psi(protos[y] + sigma * torch.randn(len(y), protos.shape[1], generator=noise))
        return state_to_arrays(psi.state_dict(), PSI)

    def aggregate(self, round: int, uplinks: Mapping[str, Payload]) -> dict[str, float]:
        if round >= self.ctx.rounds:
            metrics = {
                "psi_uploads": float(self.average_psi(uplinks)),
                **self.oracle_metrics(round),
            }
            agreements = [
                float(p.meta["synthetic_agreement"])
                for p in uplinks.values()
                if isinstance(p.meta.get("synthetic_agreement"), (int, float))
            ]
            if agreements:
                metrics["device_agreement"] = float(np.mean(agreements))
            self._save_generator()
            return metrics
        metrics = self.aggregate_prototypes(uplinks)
        sigmas = [
            np.asarray(p.arrays[SIGMA], np.float64)
            for p in uplinks.values()
            if SIGMA in p.arrays
            and p.arrays[SIGMA].shape == (self.layout.dim,)
            and (p.arrays[SIGMA] > 0).all()
        ]
        if sigmas:
            self.sigma = np.mean(sigmas, axis=0).astype(np.float32)
        if self.sigma is not None:
            metrics["sigma_mean"] = float(self.sigma.mean())
        if self.options.psi_every_round:
            metrics["psi_uploads"] = float(self.average_psi(uplinks))
            metrics.update(self.oracle_metrics(round))
            if round == self.ctx.rounds - 1:
                self._save_generator()
        return metrics

    @torch.no_grad()
    def oracle_metrics(self, round: int) -> dict[str, float]:
        """The oracle's verdict on the averaged ψ: per known class, the share of
        ``oracle_samples`` samples ψ(v), v ~ N(c^y, diag σ²), it assigns to y; and their mean."""
        if (
            self.oracle is None
            or self.psi is None
            or self.sigma is None
            or not self.table.known.any()
        ):
            return {}
        psi = load_decoder(self.layout, self.psi)
        classes = np.flatnonzero(self.table.known).tolist()
        noise = torch.Generator().manual_seed(int(self.ctx.rng(round, 5).integers(2**31)))
        per = self.options.oracle_samples
        x, y = generate(
            psi,
            torch.from_numpy(self.table.values.astype(np.float32)),
            torch.from_numpy(self.sigma),
            classes,
            per,
            noise,
        )
        hit = (self.oracle(x).argmax(1) == y).float().reshape(len(classes), per).mean(1)
        out = {f"oracle_agreement_{c}": float(h) for c, h in zip(classes, hit, strict=True)}
        out["oracle_agreement"] = float(hit.mean())
        return out

    def _save_generator(self) -> None:
        path = self.options.save_generator
        if not path or self.psi is None or self.sigma is None:
            return
        save_generator(path, self.layout, self.psi, self.table, self.sigma)

    def state_dict(self) -> dict[str, np.ndarray]:
        return {**super().state_dict(), **self.sigma_arrays(), **(self.psi or {})}

    def load_state_dict(self, arrays: Mapping[str, np.ndarray]) -> None:
        super().load_state_dict(arrays)
        if SIGMA in arrays:
            self.sigma = np.array(arrays[SIGMA], np.float32)
        psi = {k: np.array(v) for k, v in arrays.items() if k.startswith(PSI)}
        if psi:
            self.psi = psi


def load_oracle(path: str | Path, spec: ModelSpec, num_classes: int) -> nn.Module:
    """The oracle classifier from a local model file (safetensors; never a pickle), checked to
    take the fleet's input and to predict its classes."""
    from edgefl.errors import ModelFileError
    from edgefl.models.files import load_model_file

    try:
        model = load_model_file(path)
    except ModelFileError as e:
        raise ConfigError(f"fedvtc option oracle: {e}") from None
    if tuple(model.spec.in_shape) != tuple(spec.in_shape) or model.spec.num_classes != num_classes:
        raise ConfigError(
            f"fedvtc option oracle: {path} takes {model.spec.in_shape} and predicts "
            f"{model.spec.num_classes} classes; the fleet's models take {spec.in_shape} "
            f"with {num_classes}"
        )
    return model.eval()
