"""What the server assigns a device at registration, and the device half built from it.

An :class:`Assignment` travels as the meta of an ``assign`` envelope (model spec, algorithm and
options, training settings, rounds, run seed, the run's class names); :func:`build_assigned`
makes the device half exactly as the in-memory simulation makes it for the same configuration
and shard, with the device's own data labelled in the run's class order (:func:`align_classes`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgefl.errors import ConfigError, WireError
from edgefl.models.spec import ModelSpec
from edgefl.runtime.dataspec import DataSpec

if TYPE_CHECKING:  # torch-backed; imported when a model is built (registration needs no torch)
    from edgefl.algorithms import TrainSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Assignment:
    """What the server tells a device at registration (the meta of an ``assign`` envelope)."""

    spec: ModelSpec
    algorithm: str
    options: dict[str, str]
    settings: TrainSettings
    rounds: int
    seed: int
    public_fraction: float
    epoch: str
    accepted: bool = False
    classes: tuple[str, ...] = ()  # the run's class names, in the model's order ((): not told)

    def to_meta(self) -> dict[str, Any]:
        return {
            "spec": json.dumps(self.spec.to_dict(), sort_keys=True),
            "algorithm": self.algorithm,
            "options": json.dumps(self.options, sort_keys=True),
            "settings": json.dumps(dataclasses.asdict(self.settings), sort_keys=True),
            "rounds": self.rounds,
            "seed": self.seed,
            "public_fraction": self.public_fraction,
            "epoch": self.epoch,
            "accepted": self.accepted,
            "classes": json.dumps(list(self.classes)),
        }

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> Assignment:
        from edgefl.algorithms import TrainSettings

        try:
            settings = json.loads(meta["settings"])
            settings["lr_decay_rounds"] = tuple(settings.get("lr_decay_rounds", ()))
            return cls(
                spec=ModelSpec.from_dict(json.loads(meta["spec"])),
                algorithm=str(meta["algorithm"]),
                options={str(k): str(v) for k, v in json.loads(meta["options"]).items()},
                settings=TrainSettings(**settings),
                rounds=int(meta["rounds"]),
                seed=int(meta["seed"]),
                public_fraction=float(meta["public_fraction"]),
                epoch=str(meta["epoch"]),
                accepted=bool(meta.get("accepted", False)),
                classes=_class_names(json.loads(meta.get("classes", "[]"))),
            )
        except (KeyError, TypeError, ValueError, json.JSONDecodeError) as e:
            raise WireError(f"invalid assignment: {type(e).__name__}: {e}") from None

    def same_work(self, other: Assignment | None) -> bool:
        """Equal up to the server's epoch and acceptance: the built half can be kept."""
        return other is not None and dataclasses.replace(
            self, epoch="", accepted=False
        ) == dataclasses.replace(other, epoch="", accepted=False)


def _class_names(value: Any) -> tuple[str, ...]:
    """The assignment's class names: a bounded list of short strings."""
    if (
        not isinstance(value, list)
        or len(value) > 10_000
        or not all(isinstance(c, str) and 0 < len(c) <= 200 for c in value)
    ):
        raise ValueError("classes must be a list of at most 10,000 names of 1 to 200 characters")
    return tuple(value)


def align_classes(run_data, classes: tuple[str, ...]):
    """The device's data labelled in the run's class order. An image folder numbers its classes
    by its sorted folder names, and a device may lack some classes; the model's class i is the
    run's ``classes[i]``. Folders are matched by name, case and punctuation aside (``t-shirt-top``
    is ``T-shirt/top``); a folder that names no class of the run is refused (ConfigError)."""
    from edgefl.inference import class_index_map

    have = tuple(run_data.info.class_names)
    if not classes or have == tuple(classes):
        return run_data
    try:
        index, _ = class_index_map(have, classes)
    except ConfigError as e:
        raise ConfigError(
            f"this device's data does not fit the run's classes ({', '.join(classes)}): {e}"
        ) from None
    info = dataclasses.replace(run_data.info, num_classes=len(classes), class_names=tuple(classes))

    def relabel(ds):
        return type(ds).from_numpy(ds.x.numpy(), index[ds.y.numpy()], info)

    log.info("data classes mapped to the run's: %s",
             ", ".join(f"{h} -> {classes[i]}" for h, i in zip(have, index, strict=True)))
    return dataclasses.replace(
        run_data,
        train=relabel(run_data.train),
        evals={k: relabel(v) for k, v in run_data.evals.items()},
        public=None if run_data.public is None else relabel(run_data.public),
    )


def build_assigned(data: DataSpec, a: Assignment, device_id: str, compute: str = "cpu"):
    """The device half and evaluation sets that the run assembly builds for this device: exactly
    what the in-memory simulation builds for the same configuration and shard, its labels in the
    run's class order (:func:`align_classes`). A package the run needs that is not installed here
    is a :class:`ConfigError` naming it: waiting for another assignment would not change it."""
    from edgefl.privacy.declare import REPEATABLE_NOISE_ENV

    try:
        from edgefl.runtime.setup import build_device, load_run_data, resolve_method
    except ModuleNotFoundError as e:  # e.g. torch or cryptography missing from this install
        package = (e.name or "").split(".")[0]
        if not package or package == "edgefl":  # not a missing install: a bug, raised as it is
            raise
        raise ConfigError(
            f"device {device_id} cannot build its {a.algorithm} run: the Python package "
            f"{package} is not installed here; a device that trains needs "
            "`pip install 'edgefl-toolkit[train]'` (docs/install-pi-jetson.md)") from e

    method = resolve_method(a.algorithm, a.options, a.public_fraction)
    if os.environ.get(REPEATABLE_NOISE_ENV) == "1":  # a device process a simulation started itself
        method = dataclasses.replace(method, repeatable_noise=True)
    run_data = align_classes(load_run_data(data, method.needs.public_share), a.classes)
    shard = data.shard[0] if data.shard is not None else 0
    half = build_device(
        method, device_id, a.spec, run_data, shard, a.settings, a.seed, a.rounds, compute=compute
    )
    return half, run_data.evals
