"""Names, seeds and settings derived from a run configuration, each computed here and only here
(the rounds a run exchanges in all: :func:`edgefl.algorithms.base.total_rounds`, which the method
halves below the runtime use too, through :meth:`Method.total_rounds
<edgefl.runtime.method.Method.total_rounds>` and ``ServerContext.total_rounds``; the round loop's
settings: :func:`~edgefl.runtime.run.loop_settings`)."""

from __future__ import annotations

import dataclasses
import hashlib
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from edgefl.algorithms import TrainSettings
    from edgefl.config import RunConfig


def derive_seed(seed: int, name: str) -> int:
    """A stable 31-bit seed for ``name`` (a device id) under the run seed."""
    return (
        int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:4], "little")
        & 0x7FFFFFFF
    )


def device_ids(n: int) -> list[str]:
    width = max(2, len(str(n - 1)))
    return [f"d{i:0{width}d}" for i in range(n)]


def run_dir_for(cfg: RunConfig) -> Path:
    name = (
        cfg.run_name or f"{datetime.now():%Y%m%d-%H%M%S}-{cfg.algorithm}-{cfg.dataset}-s{cfg.seed}"
    )
    return Path(cfg.out_dir) / name


def train_settings(cfg: RunConfig) -> TrainSettings:
    from edgefl.algorithms import TrainSettings

    return from_config(TrainSettings, cfg, lr_decay_rounds=tuple(cfg.lr_decay_rounds))


T = TypeVar("T")


def from_config(cls: type[T], cfg: RunConfig, **others: Any) -> T:
    """A ``cls`` (a dataclass) whose fields take the values of ``cfg``'s fields of the same
    names; ``others`` give the fields that ``cfg`` names otherwise or lacks."""
    names = {f.name for f in dataclasses.fields(cls)} - others.keys()
    values = {name: value for name, value in cfg if name in names}
    if missing := names - values.keys():
        names = ", ".join(sorted(missing))
        raise TypeError(f"{cls.__name__}: the run configuration has no {names}")
    return cls(**values, **others)


def run_tiers(cfg: RunConfig) -> list[str]:
    from edgefl.models import family_tiers

    return list(cfg.tiers) if cfg.tiers else family_tiers(cfg.model)
