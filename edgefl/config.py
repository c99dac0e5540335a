"""The typed run configuration, validated at the edge (CLI flags or a TOML file).

Precedence: explicit options (flags, then file) > the algorithm's paper defaults > these defaults.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from edgefl.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class RunConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    algorithm: str = "fedavg"
    options: dict[str, str] = Field(default_factory=dict, description="algorithm options key=value")

    # data
    dataset: str = "fashion-mnist"
    data_dir: str | None = None
    partition: Literal["iid", "dirichlet", "shards"] = "iid"
    alpha: float = 0.5
    classes_per_client: int = 2
    min_size: int = 10
    train_samples: int | None = None  # subsample the training set (quick runs)
    test_samples: int | None = None  # subsample the test set for the final evaluation
    eval_samples: int = 2000  # test samples for per-round evaluation
    # evaluate on this many training samples held out (tuning)
    validation_samples: int | None = None
    public_fraction: float | None = None  # override the algorithm's server-held share

    # fleet
    clients: int = 10
    fraction: float = 1.0
    # Two thresholds, two names (Flower's min_available_clients / min_fit_clients): devices that
    # must be ready before the first round, and the fewest devices a round trains (None: what
    # ``fraction`` implies, at least one).
    min_devices: int = 1
    min_fit: int | None = None
    model: str = "cnn"
    tiers: tuple[str, ...] | None = None  # None: every tier of the family, round-robin over devices
    # devices/*.yaml fleet: device ids + profiles; tiers by the tier policy
    fleet_file: str | None = None
    width: float = 1.0
    feature_dim: int | None = None
    head: str = "linear"
    model_options: dict[str, str] = Field(default_factory=dict)

    # rounds and local work
    rounds: int = 10
    epochs: int = 1
    steps: int | None = None
    batch_size: int = 32
    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 0.0
    lr_decay_rounds: tuple[int, ...] = ()
    lr_gamma: float = 0.1
    max_grad_norm: float | None = None  # each local step's gradient clipped to this L2 norm
    eval_every: int = 1
    timeout: float | None = None
    # the server optimizer over averaged weights (edgefl.algorithms.server_opt; Reddi et al. 2021):
    # fedavg = plain averaging; lr None = the optimizer's default η
    server_opt: Literal["fedavg", "fedavgm", "fedadagrad", "fedyogi", "fedadam"] = "fedavg"
    server_opt_lr: float | None = None
    server_opt_betas: tuple[float, float] = (0.9, 0.99)
    server_opt_eps: float = 1e-3
    # rounds ("sync") or asynchronous buffered aggregation (FedBuff; edgefl.runtime.buffered): the
    # server aggregates every `buffer` arrivals (None: min(10, clients)); in memory only
    aggregation: Literal["sync", "async"] = "sync"
    buffer: int | None = None

    # run
    seed: int = 0
    out_dir: str = "runs"
    run_name: str | None = None
    threads: int | None = None
    # where the devices train: cpu (the default: the same numbers on every machine), cuda,
    # cuda:N, or auto (CUDA when this torch build sees a GPU)
    train_device: str = "cpu"

    @property
    def buffer_size(self) -> int | None:
        """Updates per asynchronous aggregation; None for rounds."""
        return (self.buffer or min(10, self.clients)) if self.aggregation == "async" else None

    @field_validator("alpha")
    @classmethod
    def _alpha(cls, v: float) -> float:
        if v <= 0:
            raise ValueError(f"alpha must be > 0 (got {v})")
        return v

    @field_validator("fraction")
    @classmethod
    def _fraction(cls, v: float) -> float:
        if not 0 < v <= 1:
            raise ValueError(f"fraction must be in (0, 1] (got {v})")
        return v

    @field_validator(
        "clients",
        "rounds",
        "epochs",
        "batch_size",
        "min_devices",
        "classes_per_client",
        "eval_samples",
    )
    @classmethod
    def _positive(cls, v: int, info) -> int:
        if v < 1:
            raise ValueError(f"{info.field_name} must be >= 1 (got {v})")
        return v

    @field_validator("lr", "width", "lr_gamma", "max_grad_norm")
    @classmethod
    def _positive_float(cls, v: float | None, info) -> float | None:
        if v is not None and v <= 0:
            raise ValueError(f"{info.field_name} must be > 0 (got {v})")
        return v

    @field_validator(
        "steps",
        "train_samples",
        "test_samples",
        "validation_samples",
        "feature_dim",
        "threads",
        "timeout",
        "min_fit",
        "server_opt_lr",
        "buffer",
    )
    @classmethod
    def _optional_positive(cls, v, info):
        if v is not None and v <= 0:
            raise ValueError(f"{info.field_name} must be > 0 (got {v})")
        return v

    @field_validator("server_opt_betas")
    @classmethod
    def _betas(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= b < 1 for b in v):
            raise ValueError(f"server_opt_betas must each be in [0, 1) (got {v})")
        return v

    @field_validator("server_opt_eps")
    @classmethod
    def _eps(cls, v: float) -> float:
        if not 0 < v < float("inf"):
            raise ValueError(f"server_opt_eps must be a finite number > 0 (got {v})")
        return v

    @field_validator("public_fraction")
    @classmethod
    def _public(cls, v):
        if v is not None and not 0 <= v < 1:
            raise ValueError(f"public_fraction must be in [0, 1) (got {v})")
        return v

    @model_validator(mode="after")
    def _consistent(self):
        if self.min_devices > self.clients:
            raise ValueError(f"min_devices ({self.min_devices}) exceeds clients ({self.clients})")
        if self.min_fit is not None and self.min_fit > self.clients:
            raise ValueError(f"min_fit ({self.min_fit}) exceeds clients ({self.clients})")
        if self.buffer is not None and self.aggregation != "async":
            raise ValueError(
                "buffer is the size of an asynchronous aggregation: give aggregation=async too"
            )
        if self.buffer is not None and self.buffer > self.clients:
            raise ValueError(
                f"buffer ({self.buffer}) exceeds clients ({self.clients}): it would never fill"
            )
        return self


#: Run settings added to RunConfig after results keyed by a configuration were stored (benchmark
#: cells, the demo's cached Local reference), each with the value that reproduces the computation
#: from before it existed. :func:`run_key_dump` leaves a setting out while it has that value, so
#: adding a setting that is off by default re-keys nothing; another value, or a later default that
#: differs, is keyed. A fact about the settings' history: entries are never removed.
ADDED_SETTINGS: dict[str, Any] = {
    # the server optimizer (issue 39): plain averaging
    "server_opt": "fedavg",
    "server_opt_lr": None,
    "server_opt_betas": [0.9, 0.99],
    "server_opt_eps": 1e-3,
    # asynchronous buffered aggregation (issue 39): rounds
    "aggregation": "sync",
    "buffer": None,
    # the devices' training device (--train-device): the CPU
    "train_device": "cpu",
    # a local step's gradient clip (--max-grad-norm, issue 37): none
    "max_grad_norm": None,
}


def run_key_dump(cfg: RunConfig, exclude: set[str]) -> dict[str, Any]:
    """``cfg`` as JSON-ready values for a key over stored results: ``exclude`` left out, and every
    :data:`ADDED_SETTINGS` entry left out while it has its neutral value."""
    run = cfg.model_dump(mode="json", exclude=exclude)
    return {k: v for k, v in run.items() if not (k in ADDED_SETTINGS and v == ADDED_SETTINGS[k])}


def _errors(e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "config"
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc not in msg else msg)
    return "; ".join(parts)


def load_toml(path: str | Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None


def resolve_config(
    explicit: dict[str, Any], algorithm_defaults: dict[str, Any] | None = None
) -> RunConfig:
    """Merge explicit settings over the algorithm's defaults, then validate.

    The algorithm's default tiers and model options belong to its default model: they apply only
    when the user keeps that model. With a fleet file the tier policy chooses among all the
    family's tiers unless tiers are given explicitly.
    """
    defaults = dict(algorithm_defaults or {})
    if "model" in explicit and explicit["model"] != defaults.get("model"):
        for key in ("tiers", "model_options"):
            if key not in explicit:
                defaults.pop(key, None)
    # the tier policy picks from every tier
    if explicit.get("fleet_file") and "tiers" not in explicit:
        defaults.pop("tiers", None)
    # asking for epochs overrides a default step count
    if "epochs" in explicit and "steps" not in explicit:
        defaults.pop("steps", None)
    try:
        return RunConfig(**{**defaults, **explicit})
    except ValidationError as e:
        raise ConfigError(_errors(e)) from None
