"""Names, seeds and settings derived from a run configuration, each computed here and only here
(the rounds a run exchanges in all: :meth:`Method.total_rounds
<edgefl.runtime.method.Method.total_rounds>`; the round loop's settings:
:func:`~edgefl.runtime.run.loop_settings`)."""

from __future__ import annotations

import hashlib
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgefl.algorithms import TrainSettings
    from edgefl.config import RunConfig


def derive_seed(seed: int, name: str) -> int:
    """A stable 31-bit seed for ``name`` (a device id) under the run seed."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:4], "little") & 0x7FFFFFFF


def device_ids(n: int) -> list[str]:
    width = max(2, len(str(n - 1)))
    return [f"d{i:0{width}d}" for i in range(n)]


def run_dir_for(cfg: RunConfig) -> Path:
    name = cfg.run_name or f"{datetime.now():%Y%m%d-%H%M%S}-{cfg.algorithm}-{cfg.dataset}-s{cfg.seed}"
    return Path(cfg.out_dir) / name


def train_settings(cfg: RunConfig) -> TrainSettings:
    from edgefl.algorithms import TrainSettings

    return TrainSettings(
        epochs=cfg.epochs,
        steps=cfg.steps,
        batch_size=cfg.batch_size,
        optimizer=cfg.optimizer,
        lr=cfg.lr,
        momentum=cfg.momentum,
        weight_decay=cfg.weight_decay,
        lr_decay_rounds=tuple(cfg.lr_decay_rounds),
        lr_gamma=cfg.lr_gamma,
    )


def run_tiers(cfg: RunConfig) -> list[str]:
    from edgefl.models import family_tiers

    return list(cfg.tiers) if cfg.tiers else family_tiers(cfg.model)
