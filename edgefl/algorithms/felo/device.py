"""The device halves of FedHe, Felo and Velo (:mod:`edgefl.algorithms.felo`), one per method and
options type: CE plus distillation of the server's per-class logits (and features), and the
per-class knowledge collected while training. The loss: docs/methods/felo.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from edgefl.algorithms.base import DeviceHalf
from edgefl.algorithms.felo.options import WEIGHTS, FedHeOptions, FeloOptions, VeloOptions
from edgefl.algorithms.training import recalibrate_batch_norm, train_local
from edgefl.errors import WireError
from edgefl.privacy import ClassStats, Release
from edgefl.wire import ArraySpec, Payload, array_spec, arrays_to_state, in_group, state_to_arrays


@dataclass
class LossTerms:
    total: torch.Tensor
    ce: torch.Tensor
    mse: torch.Tensor
    kl: torch.Tensor
    features: torch.Tensor
    logits: torch.Tensor


def felo_loss(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    alpha: float,
    known: torch.Tensor | None = None,
    server_logit: torch.Tensor | None = None,
    server_feat: torch.Tensor | None = None,
    temperature: float = 1.0,
    server_feature_ce: float = 0.0,
) -> LossTerms:
    """mean_i [ CE_i + α·known(y_i)·(MSE_i + KL_i) ]; no server statistics → plain CE.
    ``server_feature_ce`` > 0 adds that weight × the mean CE of the classifier on the server's
    feature of every known class, labelled with its class (it trains the classifier only).

    MSE_i is the mean squared error over the d feature dims (it trains the extractor only);
    KL_i = Σ_c q_c·(log q_c − log p_c) with q = softmax(p̄_y/T), p = softmax(p(x)/T), times T².
    """
    s = model.features(x)
    p = model.classify(s)
    ce = F.cross_entropy(p, y)
    zero = p.new_zeros(())
    mse, kl = zero, zero
    if known is not None and server_logit is not None and bool(known[y].any()):
        mask = known[y].to(p.dtype)
        batch = len(y)
        t = temperature
        kl_i = (
            F.kl_div(
                F.log_softmax(p / t, 1), F.softmax(server_logit[y] / t, 1), reduction="none"
            ).sum(1)
            * t
            * t
        )
        kl = (kl_i * mask).sum() / batch
        if server_feat is not None:
            mse_i = ((s - server_feat[y]) ** 2).mean(1)
            mse = (mse_i * mask).sum() / batch
    total = ce + alpha * (mse + kl)
    if (
        server_feature_ce > 0
        and known is not None
        and server_feat is not None
        and bool(known.any())
    ):
        classes = torch.nonzero(known).flatten()
        total = total + server_feature_ce * F.cross_entropy(
            model.classify(server_feat[classes]), classes
        )
    return LossTerms(total, ce, mse, kl, s, p)


class KnowledgeCollector:
    """Per-class sums of features and logits seen during training, and feature points for Velo."""

    def __init__(self, num_classes: int, feature_dim: int, points: str | None, per_class: int):
        self.c, self.d = num_classes, feature_dim
        self.feat = np.zeros((num_classes, feature_dim))
        self.logit = np.zeros((num_classes, num_classes))
        self.count = np.zeros(num_classes, np.int64)
        self.mode, self.per_class = points, per_class
        self.point_feats: list[np.ndarray] = []
        self.point_labels: list[np.ndarray] = []

    def add(self, s: torch.Tensor, p: torch.Tensor, y: torch.Tensor) -> None:
        s_np, p_np = s.detach().double().cpu().numpy(), p.detach().double().cpu().numpy()
        y_np = y.cpu().numpy()
        np.add.at(self.feat, y_np, s_np)
        np.add.at(self.logit, y_np, p_np)
        np.add.at(self.count, y_np, 1)
        if self.mode == "batch-means":
            labels = np.unique(y_np)
            self.point_feats.append(np.stack([s_np[y_np == c].mean(0) for c in labels]))
            self.point_labels.append(labels)
        elif self.mode == "samples":
            self.point_feats.append(s_np)
            self.point_labels.append(y_np)

    def arrays(self, rng: np.random.Generator, features: bool) -> dict[str, np.ndarray]:
        n = np.maximum(self.count, 1)[:, None]
        out = {"logit": (self.logit / n).astype(np.float32), "count": self.count.copy()}
        if features:
            out["feat"] = (self.feat / n).astype(np.float32)
        if self.mode is not None:
            feats = np.concatenate(self.point_feats) if self.point_feats else np.zeros((0, self.d))
            labels = (
                np.concatenate(self.point_labels) if self.point_labels else np.zeros(0, np.int64)
            )
            keep = []
            for c in range(self.c):
                idx = np.flatnonzero(labels == c)
                if len(idx) > self.per_class:
                    idx = np.sort(rng.choice(idx, size=self.per_class, replace=False))
                keep.append(idx)
            keep_idx = np.concatenate(keep).astype(np.int64)
            out["point"] = feats[keep_idx].astype(np.float32).reshape(-1, self.d)
            out["point_label"] = labels[keep_idx].astype(np.int64)
        return out


class FedHeDevice(DeviceHalf):
    """FedHe's device half: distils the server's per-class logits and uploads its own, with counts.
    Felo's and Velo's extend it, each with its own options type."""

    #: uploads per-class mean features and distils the server's (Felo, Velo)
    shares_features: ClassVar[bool] = False

    def __init__(self, ctx, options: FedHeOptions):
        super().__init__(ctx, options)
        self.options: FedHeOptions = options
        self.known: torch.Tensor | None = None
        self.server_logit: torch.Tensor | None = None

    def expected_downlink(self) -> dict[str, ArraySpec]:
        """The server's knowledge every round."""
        c = self.ctx.num_classes
        return {"known": array_spec(np.uint8, (c,)), "logit": array_spec(np.float32, (c, c))}

    def receive(self, round: int, payload: Payload) -> None:
        arrays = payload.arrays
        if "known" not in arrays:
            return
        c = self.ctx.num_classes
        known, logit = np.asarray(arrays["known"]), np.asarray(arrays.get("logit"))
        if known.shape != (c,) or logit.shape != (c, c):
            raise WireError(
                f"knowledge of shape known {known.shape}, logit {logit.shape}; "
                f"expected ({c},), ({c}, {c})"
            )
        self.known = torch.as_tensor(known.astype(bool), device=self.device)
        # a copy: a received array is read-only
        self.server_logit = torch.tensor(logit, dtype=torch.float32, device=self.device)

    @classmethod
    def privacy_release(cls, options: FedHeOptions) -> Release:
        """Per-class mean logits with counts."""
        return Release(stats=ClassStats(("logit",), reduce="mean", counts="count"))

    def sample_vectors(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        s = self.model.features(x)
        return {"logit": self.model.classify(s), "feat": s}

    def distills(self, round: int) -> bool:
        return round >= self.options.warmup_rounds(self.ctx.rounds) and self.known is not None

    def teacher(self) -> dict[str, Any]:
        """The server's statistics :func:`felo_loss` distils (once :meth:`distills`)."""
        return {
            "known": self.known,
            "server_logit": self.server_logit,
            "temperature": self.options.temperature,
        }

    def loss_terms(self, x: torch.Tensor, y: torch.Tensor, round: int) -> LossTerms:
        if not self.distills(round):
            return felo_loss(self.model, x, y, alpha=self.options.alpha)
        return felo_loss(self.model, x, y, alpha=self.options.alpha, **self.teacher())

    def collector(self) -> KnowledgeCollector:
        """What collects this round's per-class knowledge (no feature points)."""
        return KnowledgeCollector(self.ctx.num_classes, self.model.feature_dim, None, 0)

    def weights_uplink(self) -> dict[str, np.ndarray]:
        """The weights the uplink carries besides the knowledge: none."""
        return {}

    def fit(self, round: int) -> Payload:
        collector = self.collector()
        sums = {"mse": 0.0, "kl": 0.0, "batches": 0}

        def loss_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            terms = self.loss_terms(x, y, round)
            # train mode, before the step (the code's)
            collector.add(terms.features, terms.logits, y)
            sums["mse"] += float(terms.mse.detach())
            sums["kl"] += float(terms.kl.detach())
            sums["batches"] += 1
            return terms.total

        data, settings = self.ctx.train_data, self.ctx.settings
        stats = train_local(self.model, data, settings, round, self.ctx.rng(round), loss_fn)
        arrays = collector.arrays(self.ctx.rng(round, stream=1), features=self.shares_features)
        arrays.update(self.weights_uplink())
        n = max(sums["batches"], 1)
        meta = {
            "num_samples": len(self.ctx.train_data),
            "distill": self.distills(round),
            "mse": sums["mse"] / n,
            "kl": sums["kl"] / n,
            **stats,
        }
        return Payload(arrays, meta)


class FeloDevice(FedHeDevice):
    """Felo's device half: FedHe's plus per-class features, and the averaged weights of its
    architecture when the options share them and another device of the fleet has it."""

    shares_features = True

    def __init__(self, ctx, options: FeloOptions):
        super().__init__(ctx, options)
        self.options: FeloOptions = options
        self.receives_weights = False  # the server averages this architecture: send weights back
        self.server_feat: torch.Tensor | None = None

    def expected_downlink(self) -> dict[str, ArraySpec]:
        """The server's knowledge every round; this architecture's averaged weights when the
        options share weights and another device has the architecture (the server decides)."""
        out = super().expected_downlink()
        out["feat"] = array_spec(np.float32, (self.ctx.num_classes, self.model.feature_dim))
        if self.options.shares_weights:
            out.update(in_group(self.weight_specs(WEIGHTS), "weights"))
        return out

    def receive(self, round: int, payload: Payload) -> None:
        state = arrays_to_state(payload.arrays, WEIGHTS)
        self.receives_weights = bool(state)
        if state:
            self.model.load_state_dict(state, strict=True)
            if self.options.bn_stats == "recalibrate":
                recalibrate_batch_norm(self.model, self.ctx.train_data)
        super().receive(round, payload)
        arrays = payload.arrays
        if "known" not in arrays:
            return
        c, d = self.ctx.num_classes, self.model.feature_dim
        self.server_feat = None
        if "feat" in arrays:
            feat = np.asarray(arrays["feat"])
            if feat.shape != (c, d):
                raise WireError(
                    f"server features of shape {feat.shape}; this model needs ({c}, {d})"
                )
            self.server_feat = torch.tensor(feat, dtype=torch.float32, device=self.device)

    @classmethod
    def privacy_release(cls, options: FeloOptions) -> Release:
        """Per-class mean logits and features with counts; the architecture's weights when the
        options share them."""
        stats = ClassStats(("logit", "feat"), reduce="mean", counts="count")
        return Release(whole=(WEIGHTS,) if options.shares_weights else (), stats=stats)

    def teacher(self) -> dict[str, Any]:
        return {
            **super().teacher(),
            "server_feat": self.server_feat,
            "server_feature_ce": self.options.server_feature_ce,
        }

    def weights_uplink(self) -> dict[str, np.ndarray]:
        """This architecture's weights, when the server sent its average (the options share
        weights and another device has the architecture)."""
        if self.options.shares_weights and self.receives_weights:
            return state_to_arrays(self.model.state_dict(), WEIGHTS)
        return {}


class VeloDevice(FeloDevice):
    """Velo's device half: Felo's plus feature points for the server's CVAE."""

    def __init__(self, ctx, options: VeloOptions):
        super().__init__(ctx, options)
        self.options: VeloOptions = options

    @classmethod
    def privacy_release(cls, options: VeloOptions) -> Release:
        """Felo's statistics; the feature points are single samples' features (or a batch's):
        no per-class bound covers them."""
        stats = ClassStats(("logit", "feat"), reduce="mean", counts="count")
        return Release(
            stats=stats,
            unprotected=("point", "point_label"),
            reason="are features of single samples (or of a minibatch)",
        )

    def collector(self) -> KnowledgeCollector:
        """Collects feature points too, as ``feature_upload`` says."""
        opts = self.options
        return KnowledgeCollector(
            self.ctx.num_classes, self.model.feature_dim, opts.feature_upload, opts.points_per_class
        )
