"""Velo's server half (:mod:`edgefl.algorithms.felo`): Felo's, plus a conditional VAE trained on
the devices' feature points whose samples replace the averaged per-class features. The
derivation: docs/methods/felo.md."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
import torch

from edgefl.algorithms.cvae import (
    CVAE,
    EMBED_DIM,
    conditional_fit,
    cvae_arrays,
    generate,
    load_cvae_arrays,
    train_cvae,
)
from edgefl.algorithms.felo.options import VeloOptions
from edgefl.algorithms.felo.server import ClassHistory, FeloServer
from edgefl.wire import ArraySpec, Payload, array_spec

log = logging.getLogger(__name__)


class VeloServer(FeloServer):
    """Felo's server plus the CVAE: synthetic per-class features replace the averages."""

    def __init__(self, ctx, options: VeloOptions):
        super().__init__(ctx, options)
        self.options: VeloOptions = options
        self.points = ClassHistory(ctx.num_classes, self.feature_dim, options.cvae_buffer)
        with torch.random.fork_rng():
            torch.manual_seed(ctx.seed)
            self.cvae = CVAE(ctx.num_classes, self.feature_dim, EMBED_DIM)
        self.trained = False
        self.synthetic = np.zeros((ctx.num_classes, self.feature_dim), np.float32)

    def feature_mean(self) -> np.ndarray:
        if not self.trained:
            return super().feature_mean()
        return self.synthetic.copy()

    def _valid(self, device_id: str, p: Payload) -> bool:
        if not super()._valid(device_id, p):
            return False
        point, label = p.arrays.get("point"), p.arrays.get("point_label")
        if point is None or label is None:
            return True  # points are optional (a device may send none); the means still count
        ok = (
            np.ndim(point) == 2
            and np.shape(point)[1] == self.feature_dim
            and np.shape(label) == (np.shape(point)[0],)
            and np.issubdtype(np.asarray(label).dtype, np.integer)
            and bool(np.all((label >= 0) & (label < self.ctx.num_classes)))
        )
        if not ok:
            log.warning("ignoring the knowledge of %s: malformed feature points", device_id)
        return ok

    def point_specs(self) -> dict[str, ArraySpec]:
        """As many points as the device saw."""
        return {
            "point": array_spec(np.float32, (None, None)),
            "point_label": array_spec(np.int64, (None,)),
        }

    def absorb(self, payload: Payload) -> None:
        if "point" in payload.arrays:
            for vec, c in zip(payload.arrays["point"], payload.arrays["point_label"], strict=True):
                self.points.add(int(c), vec, 1.0)

    def train_due(self, round: int) -> bool:
        start = max(self.options.warmup_rounds(self.ctx.rounds) - 1, 0)
        return round >= start and (
            (round - start) % self.options.cvae_interval == 0 or not self.trained
        )

    def aggregate(self, round: int, uplinks: Mapping[str, Payload]) -> dict[str, float]:
        metrics = super().aggregate(round, uplinks)
        if self.train_due(round):
            known = self.points.known()
            feats = [self.points.entries(c) for c in range(self.ctx.num_classes)]
            labels = np.concatenate([np.full(len(f), c, np.int64) for c, f in enumerate(feats)])
            if len(labels) >= 2:
                seed = int(self.ctx.rng(round, stream=1).integers(2**31))
                losses = train_cvae(
                    self.cvae,
                    np.concatenate(feats),
                    labels,
                    epochs=self.options.cvae_epochs,
                    batch_size=self.options.cvae_batch,
                    lr=self.options.cvae_lr,
                    seed=seed,
                )
                self.trained = True
                metrics["cvae_loss"] = losses[-1] if losses else float("nan")
                metrics["cvae_points"] = float(len(labels))
                metrics["cvae_classes"] = float(known.sum())
                # the CVAE's fit: do its samples land in their class under a classifier of the
                # real points it learned from? (cvae_fit_real: that classifier on the real points)
                metrics["cvae_fit"], metrics["cvae_fit_real"], metrics["cvae_spread"] = (
                    conditional_fit(self.cvae, np.concatenate(feats), labels, seed=seed)
                )
        if self.trained:
            seed = int(self.ctx.rng(round, stream=2).integers(2**31))
            self.synthetic = generate(self.cvae, np.arange(self.ctx.num_classes), seed)
        return metrics

    def knowledge(self) -> dict[str, np.ndarray]:
        out = super().knowledge()
        if self.trained:  # a class counts as known once it has both averaged logits and CVAE data
            out["known"] = (out["known"].astype(bool) & self.points.known()).astype(np.uint8)
        return out

    def state_dict(self) -> dict[str, np.ndarray]:
        out = super().state_dict()
        out.update(self.points.state("points/"))
        out.update(cvae_arrays(self.cvae, "cvae/"))
        out["cvae_trained"] = np.array([int(self.trained)], np.int64)
        out["synthetic"] = self.synthetic.copy()
        return out

    def load_state_dict(self, arrays: Mapping[str, np.ndarray]) -> None:
        super().load_state_dict(arrays)
        self.points.load(arrays, "points/")
        load_cvae_arrays(self.cvae, arrays, "cvae/")
        if "cvae_trained" in arrays:
            self.trained = bool(np.asarray(arrays["cvae_trained"]).ravel()[0])
        if "synthetic" in arrays:
            self.synthetic = np.array(arrays["synthetic"], np.float32)
