"""FedVTC's device half (:mod:`edgefl.algorithms.fedvtc`): local training alternating the model's
step (a) and the decoder's step (b), prototypes and σ uploaded, ψ uploaded once after training,
and the closing fine-tune on synthetic samples. The derivation: docs/methods/fedvtc.md."""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from edgefl.algorithms.base import DeviceHalf
from edgefl.algorithms.fedproto import (
    PROTO,
    PROTO_CLASSES,
    local_prototypes,
    pack_prototypes,
    prototype_specs,
    unpack_prototypes,
)
from edgefl.algorithms.fedvtc.options import FedVTCOptions
from edgefl.algorithms.fedvtc.vtc import (
    PSI,
    SIGMA,
    TCTerms,
    VTCDecoder,
    build_decoder,
    class_mean_sum,
    feature_statistics,
    generate,
    tc_terms,
    trainable,
    vtc_layout,
)
from edgefl.algorithms.training import local_batches, make_optimizer, optimizer_step
from edgefl.errors import ConfigError, EdgeflError
from edgefl.privacy import ClassStats, Release
from edgefl.wire import ArraySpec, Payload, array_spec, arrays_to_state, state_to_arrays


class FedVTCDevice(DeviceHalf):
    def __init__(self, ctx, options: FedVTCOptions):
        super().__init__(ctx, options)
        self.layout = vtc_layout(ctx.spec, options.vtc_channels)
        p = self.layout.dim
        self.psi: VTCDecoder | None = None  # built from the server's seed on the first downlink
        self.log_sigma = nn.Parameter(
            torch.full((p,), math.log(options.init_sigma or 1.0), device=self.device)
        )
        self.sigma_set = options.init_sigma is not None  # else measured before the first local step
        self.protos = torch.zeros(ctx.num_classes, p, device=self.device)
        # a global prototype arrived
        self.known = torch.zeros(ctx.num_classes, dtype=torch.bool, device=self.device)
        self.phase = "train"
        self.synthetic: tuple[torch.Tensor, torch.Tensor] | None = None  # the last fine-tuning set

    # downlink
    def expected_downlink(self) -> dict[str, ArraySpec]:
        """Each part once the server has it: the global prototypes, σ, and ψ (every round with
        ``psi_every_round``, else in the final downlink)."""
        return self._downlink_specs

    @functools.cached_property
    def _downlink_specs(self) -> dict[str, ArraySpec]:
        psi = state_to_arrays(build_decoder(self.layout, 0).state_dict(), PSI)
        return {
            **prototype_specs(self.layout.dim),
            SIGMA: array_spec(np.float32, (self.layout.dim,), "sigma"),
            # 0-d tensors (BN's num_batches_tracked): any shape, as the server's check
            **{k: array_spec(v.dtype, v.shape if v.ndim else None, "psi") for k, v in psi.items()},
        }

    def receive(self, round: int, payload: Payload) -> None:
        seed = payload.meta.get("vtc_seed")
        if self.psi is None and seed is not None:
            self.psi = build_decoder(self.layout, int(seed)).to(self.device)
        self.phase = str(payload.meta.get("phase", "train"))
        for c, v in unpack_prototypes(
            payload.arrays, self.ctx.num_classes, self.layout.dim
        ).items():
            self.protos[c] = torch.tensor(np.asarray(v), dtype=torch.float32, device=self.device)
            self.known[c] = True
        if SIGMA in payload.arrays:
            sigma = np.asarray(payload.arrays[SIGMA], np.float32)
            if sigma.shape != (self.layout.dim,) or not (sigma > 0).all():
                raise ConfigError(
                    f"sigma must be positive of shape ({self.layout.dim},), got {sigma.shape}"
                )
            with torch.no_grad():
                self.log_sigma.copy_(torch.from_numpy(np.log(sigma)).to(self.device))
            self.sigma_set = True
        state = arrays_to_state(payload.arrays, PSI)
        if state:
            self._need_psi().load_state_dict(state, strict=True)

    def _need_psi(self) -> VTCDecoder:
        if self.psi is None:
            raise EdgeflError(
                "fedvtc: no decoder yet — the server's downlink carries its seed (vtc_seed)"
            )
        return self.psi

    @classmethod
    def privacy_release(cls, options) -> Release:
        return Release(
            stats=ClassStats((PROTO,), reduce="mean", classes=PROTO_CLASSES),
            unprotected=(SIGMA, PSI),
            reason="are trained parameters sent beside the prototypes (σ every round, the "
            "decoder ψ after training); "
            "no mechanism here bounds them yet",
        )

    # local work
    def fit(self, round: int) -> Payload:
        psi = self._need_psi()
        meta = {"num_samples": len(self.ctx.train_data)}
        if self.phase == "upload_psi":
            return Payload(
                state_to_arrays(psi.state_dict(), PSI), {**meta, **self.agreement(round)}
            )
        stats = self.train_round(round)
        arrays = pack_prototypes(local_prototypes(self.model, self.ctx.train_data))
        arrays[SIGMA] = self.log_sigma.detach().exp().cpu().numpy().astype(np.float32)
        if self.options.psi_every_round:
            arrays.update(state_to_arrays(psi.state_dict(), PSI))
        return Payload(arrays, {**meta, **stats})

    def initialise_from_data(self) -> None:
        """Before the first local step: local class means for the classes without a global
        prototype (``init_prototypes=local``) and σ from the spread of z around them
        (``init_sigma=None``), both measured with the model in eval mode."""
        data = self.ctx.train_data
        held = sorted(set(np.asarray(data.y).tolist()))
        missing = (
            [c for c in held if not self.known[c]]
            if self.options.init_prototypes == "local"
            else []
        )
        if not missing and self.sigma_set:
            return
        means, spread = feature_statistics(self.model, data)
        for c in missing:
            self.protos[c] = torch.from_numpy(means[c]).to(self.device)
        if not self.sigma_set:
            with torch.no_grad():
                spread = np.log(np.maximum(spread, 1e-3))
                self.log_sigma.copy_(torch.from_numpy(spread).float().to(self.device))
            self.sigma_set = True

    @torch.no_grad()
    def agreement(self, round: int) -> dict[str, float]:
        """``synthetic_agreement``: the share of ψ_k's samples (``oracle_samples`` per known
        class, from the global prototypes and σ) that this device's own model assigns to the
        intended class."""
        classes = torch.nonzero(self.known).flatten().tolist()
        if not classes or self.psi is None:
            return {}
        noise = torch.Generator().manual_seed(int(self.ctx.rng(round, 4).integers(2**31)))
        x, y = generate(
            self.psi, self.protos, self.log_sigma.exp(), classes, self.options.oracle_samples, noise
        )
        was_training = self.model.training
        self.model.eval()
        share = float((self.model(x).argmax(1) == y).float().mean())
        self.model.train(was_training)
        return {"synthetic_agreement": share}

    def vtc_optimizer(self, round: int) -> torch.optim.Optimizer:
        params = [*self._need_psi().parameters(), self.log_sigma]
        if self.options.vtc_optimizer == "adam":
            return torch.optim.Adam(params, lr=self.options.vtc_lr)
        return make_optimizer(params, self.ctx.settings, round)

    def step_model(
        self, x: torch.Tensor, y: torch.Tensor, opt: torch.optim.Optimizer, noise: torch.Generator
    ):
        """(a) Update f_k with CE + tc_weight·L_tc; ψ and σ frozen (ψ in eval mode, so its BN
        statistics do not move either). Returns (loss, CE, z of the batch before the step)."""
        model, psi, o = self.model, self._need_psi(), self.options
        trainable(psi, False)
        self.log_sigma.requires_grad_(False)
        trainable(model, True)
        model.train()
        psi.eval()
        try:
            z = model.features(x)
            ce = F.cross_entropy(model.classify(z), y)
            eps = torch.randn(z.shape, generator=noise).to(z.device)  # CPU draws: any device
            terms = tc_terms(model, psi, x, y, z, self.log_sigma, self.protos, eps, o.lam > 0)
            # align_weight replaces tc_weight on the pull of z onto c^y (KL's z-part); None: same
            align = o.tc_weight if o.align_weight is None else o.align_weight
            loss = (
                ce + o.tc_weight * (terms.le - terms.pull + o.lam * terms.dm) + align * terms.pull
            )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            optimizer_step(opt, self.ctx.settings)
        finally:
            trainable(psi, True)
            self.log_sigma.requires_grad_(True)
        return loss.detach(), ce.detach(), z.detach()

    def step_vtc(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        z: torch.Tensor,
        opt: torch.optim.Optimizer,
        noise: torch.Generator,
    ) -> TCTerms:
        """(b) Update ψ and σ with L_tc; f_k frozen (eval mode: no BN statistics, no dropout).
        ``z`` is the batch's latent from step (a)."""
        model, psi, o = self.model, self._need_psi(), self.options
        trainable(model, False)
        model.eval()
        psi.train()
        try:
            eps = torch.randn(z.shape, generator=noise).to(z.device)
            terms = tc_terms(
                model, psi, x, y, z.detach(), self.log_sigma, self.protos, eps, o.lam > 0
            )
            loss = terms.le + o.lam * terms.dm
            if o.proto_rc_weight > 0:
                draw = torch.randn(z.shape, generator=noise).to(z.device)
                v = self.protos[y] + self.log_sigma.exp() * draw
                loss = loss + o.proto_rc_weight * class_mean_sum(
                    ((psi(v) - x) ** 2).flatten(1).sum(1), y
                )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            optimizer_step(opt, self.ctx.settings)
        finally:
            trainable(model, True)
            model.train()
        return terms

    def train_round(self, round: int) -> dict[str, float]:
        """One round of local work, alternating (a) and (b) on every minibatch."""
        self.initialise_from_data()
        opt_f = make_optimizer(self.model.parameters(), self.ctx.settings, round)
        opt_v = self.vtc_optimizer(round)
        noise = torch.Generator().manual_seed(int(self.ctx.rng(round, 1).integers(2**31)))
        totals = {"train_loss": 0.0, "ce": 0.0, "l_e": 0.0, "l_dm": 0.0, "l_rc": 0.0}
        seen = 0
        for x, y in local_batches(self.ctx.train_data, self.ctx.settings, self.ctx.rng(round)):
            loss, ce, z = self.step_model(x, y, opt_f, noise)
            b = self.step_vtc(x, y, z, opt_v, noise)
            seen += len(y)
            for key, value in (
                ("train_loss", loss),
                ("ce", ce),
                ("l_e", b.le),
                ("l_dm", b.dm),
                ("l_rc", b.rc),
            ):
                totals[key] += float(value.detach()) * len(y)
        stats = {k: v / max(seen, 1) for k, v in totals.items()}
        stats["sigma_mean"] = float(self.log_sigma.detach().exp().mean())
        stats["samples_seen"] = float(seen)
        return stats

    # the end: synthetic fine-tuning
    def finish(self, round: int, payload: Payload) -> None:
        self.receive(round, payload)
        classes = torch.nonzero(self.known).flatten().tolist()
        per_class = self.options.synthetic_samples // max(self.ctx.num_classes, 1)
        if not classes or per_class == 0 or self.options.finetune_epochs == 0:
            return
        noise = torch.Generator().manual_seed(int(self.ctx.rng(round, 2).integers(2**31)))
        sigma = self.log_sigma.detach().exp() * self.options.sample_sigma_scale
        x, y = generate(self._need_psi(), self.protos, sigma, classes, per_class, noise)
        self.synthetic = (x, y)
        self.finetune(x, y, round)

    def finetune(self, x: torch.Tensor, y: torch.Tensor, round: int) -> None:
        settings = self.ctx.settings
        if self.options.finetune_lr is not None:
            settings = dataclasses.replace(
                settings, lr=self.options.finetune_lr, lr_decay_rounds=()
            )
        opt = make_optimizer(self.model.parameters(), settings, round)
        order_rng = self.ctx.rng(round, 3)
        self.model.train()
        for _ in range(self.options.finetune_epochs):
            order = torch.from_numpy(order_rng.permutation(len(y))).to(y.device)
            for start in range(0, len(y), settings.batch_size):
                rows = order[start : start + settings.batch_size]
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(self.model(x[rows]), y[rows]).backward()
                optimizer_step(opt, settings)
