"""Reference profiles and fleet files: device ids with their profiles and the fleet's tier
budget."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from edgefl.errors import ConfigError
from edgefl.profiling.profile import DeviceProfile
from edgefl.profiling.tiers import TierBudget, choose_tier

if TYPE_CHECKING:
    from edgefl.models import ModelSpec


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Availability(_Strict):
    """When a device is online, on the simulated clock (edgefl.runtime.clock).

    - ``always``: always online;
    - ``churn``: online and offline in turn, each spell exponentially distributed with mean
      ``mean_on_s`` / ``mean_off_s`` seconds (offline a fraction mean_off / (mean_on + mean_off)
      of the time); where a device starts is drawn from that same fraction;
    - ``diurnal``: online for ``on_fraction`` of every ``period_s`` (a day by default), from
      ``phase_s`` into it (None: drawn per device from the run seed).
    """

    kind: Literal["always", "churn", "diurnal"] = "always"
    mean_on_s: float | None = Field(None, gt=0)
    mean_off_s: float | None = Field(None, gt=0)
    period_s: float = Field(86400.0, gt=0)
    on_fraction: float = Field(0.5, gt=0, le=1)
    phase_s: float | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _complete(self) -> Availability:
        if self.kind == "churn" and (self.mean_on_s is None or self.mean_off_s is None):
            raise ValueError("churn needs mean_on_s and mean_off_s")
        return self

    @property
    def offline_fraction(self) -> float:
        if self.kind == "churn":
            return self.mean_off_s / (self.mean_on_s + self.mean_off_s)
        return 1.0 - self.on_fraction if self.kind == "diurnal" else 0.0


class Link(_Strict):
    """A device's link: bandwidth each way in Mbit/s (None: not a limit) and the one-way latency
    each message pays."""

    down_mbps: float | None = Field(None, gt=0)
    up_mbps: float | None = Field(None, gt=0)
    latency_ms: float = Field(0.0, ge=0)


class Conditions(_Strict):
    """How a device of the fleet lives: its availability, its link, and ``speed``, a factor on its
    profile's measured ``train_gflops`` (a tier's or a group's speed relative to its profile)."""

    availability: Availability = Availability()
    link: Link = Link()
    speed: float = Field(1.0, gt=0)


class ClockSettings(_Strict):
    """A fleet file's ``clock`` section: the devices' default conditions (each device entry may
    set its own ``availability``, ``link``, ``speed``) and a synchronous round's deadline on the
    simulated clock (None: the round waits for its slowest device)."""

    deadline_s: float | None = Field(None, gt=0)
    availability: Availability = Availability()
    link: Link = Link()
    speed: float = Field(1.0, gt=0)


def _model(cls: type[BaseModel], data: Any, where: str) -> Any:
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        why = "; ".join(
            f"{'.'.join(map(str, x['loc'])) or cls.__name__}: {x['msg']}" for x in e.errors()
        )
        raise ConfigError(f"{where}: {why}") from None


@dataclass(frozen=True)
class Fleet:
    """A fleet file loaded: device ids with their profiles, and the fleet's tier budget.

    ``budget`` holds the TierBudget fields the file sets (``memory_fraction``, ``round_seconds``,
    ``samples_per_round``, ...); a run fills in the rest (its batch size, its samples per round).
    ``conditions``: each device's availability, link and speed (the simulated clock's fleet model;
    empty where the file declares none); ``clock``: the file's ``clock`` section.
    """

    devices: tuple[tuple[str, DeviceProfile], ...]
    budget: dict[str, Any]
    path: str = ""
    conditions: dict[str, Conditions] = field(default_factory=dict, compare=False)
    clock: ClockSettings = ClockSettings()

    @property
    def ids(self) -> list[str]:
        return [d for d, _ in self.devices]


def _yaml(path: Path) -> Any:
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"file {path} does not exist") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}") from None


def load_profile(path: Path | str) -> DeviceProfile:
    """A device profile from a YAML (or JSON) file with the fields of :class:`DeviceProfile`."""
    data = _yaml(Path(path))
    if not isinstance(data, dict):
        raise ConfigError(f"device profile {path} must be a mapping of fields")
    try:
        return DeviceProfile.from_dict(data)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


_BUDGET_KEYS = {f.name for f in fields(TierBudget)}


def read_fleet(path: Path | str) -> Fleet:
    """Load a fleet file::

        budget: {memory_fraction: 0.5, round_seconds: 60}     # optional
        clock:                                                 # optional: the simulated clock
          deadline_s: 600
          availability: {kind: churn, mean_on_s: 1400, mean_off_s: 600}
          link: {down_mbps: 20, up_mbps: 5, latency_ms: 40}
        devices:
          - {id: pi4, profile: raspberry-pi-4, count: 3}       # → pi4-0, pi4-1, pi4-2
          - {id: laptop, profile: ./x86-laptop.yaml, speed: 2.0,
             link: {down_mbps: 200, up_mbps: 100, latency_ms: 5}}

    ``profile`` names a YAML file next to the fleet file (".yaml" may be left out) or holds the
    profile's fields inline. A device entry's ``availability``, ``link`` and ``speed``
    (:class:`Conditions`) replace the ``clock`` section's (:class:`ClockSettings`). A file that
    declares none of these has no conditions: its runs keep no simulated clock.
    """
    path = Path(path)
    data = _yaml(path)
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("devices"), list)
        or not data["devices"]
    ):
        raise ConfigError(f"fleet file {path} needs a non-empty 'devices' list")
    unknown = sorted(set(data) - {"budget", "devices", "description", "clock"})
    if unknown:
        raise ConfigError(f"fleet file {path}: unknown keys {', '.join(unknown)}")
    budget = dict(data.get("budget") or {})
    bad = sorted(set(budget) - _BUDGET_KEYS)
    if bad:
        raise ConfigError(f"fleet file {path}: unknown budget keys {', '.join(bad)}")
    TierBudget(**budget)  # validate now, not in the middle of a run
    clock = _model(ClockSettings, data.get("clock") or {}, f"fleet file {path}: clock")
    defaults = clock.model_dump(include={"availability", "link", "speed"})
    devices: list[tuple[str, DeviceProfile]] = []
    conditions: dict[str, Conditions] = {}
    for entry in data["devices"]:
        if not isinstance(entry, dict) or "id" not in entry or "profile" not in entry:
            raise ConfigError(
                f"fleet file {path}: each device needs 'id' and 'profile', got {entry!r}"
            )
        extra = sorted(set(entry) - {"id", "profile", "count", "availability", "link", "speed"})
        if extra:
            raise ConfigError(
                f"fleet file {path}: device {entry['id']!r}: unknown keys {', '.join(extra)}"
            )
        own = {k: entry[k] for k in ("availability", "link", "speed") if k in entry}
        cond = _model(Conditions, {**defaults, **own}, f"fleet file {path}: device {entry['id']!r}")
        count = entry.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ConfigError(
                f"fleet file {path}: count of {entry['id']!r} must be a positive integer"
            )
        ref = entry["profile"]
        if isinstance(ref, dict):
            profile = DeviceProfile.from_dict({"name": str(entry["id"]), **ref})
        else:
            file = path.parent / str(ref)
            if not file.suffix:
                file = file.with_suffix(".yaml")
            profile = load_profile(file)
        for k in range(count):
            devices.append((str(entry["id"]) if count == 1 else f"{entry['id']}-{k}", profile))
            conditions[devices[-1][0]] = cond
    ids = [d for d, _ in devices]
    duplicates = sorted({d for d in ids if ids.count(d) > 1})
    if duplicates:
        raise ConfigError(f"fleet file {path}: duplicate device ids {', '.join(duplicates)}")
    own = {"availability", "link", "speed"}
    declared = "clock" in data or any(set(e) & own for e in data["devices"])
    # the simulated clock runs where the file declares any of it (its profiles need train_gflops)
    return Fleet(tuple(devices), budget, str(path), conditions if declared else {}, clock)


def load_fleet(path: Path | str) -> list[tuple[str, DeviceProfile]]:
    """The (device_id, profile) pairs of a fleet file (see :func:`read_fleet`)."""
    return list(read_fleet(path).devices)


def fleet_tiers(
    fleet: Fleet,
    spec_template: ModelSpec,
    tiers: list[str],
    *,
    batch_size: int,
    samples_per_round: dict[str, int],
    optimizer: str = "sgd-momentum",
) -> dict[str, str]:
    """Each device's tier by :func:`choose_tier`, under the fleet's budget and the run's settings.

    The fleet file's ``samples_per_round``, where it sets one, wins over the run's.
    """
    out = {}
    for device_id, profile in fleet.devices:
        budget = TierBudget(
            **{
                "batch_size": batch_size,
                "samples_per_round": samples_per_round[device_id],
                "optimizer": optimizer,
                **fleet.budget,
            }
        )
        out[device_id] = choose_tier(profile, spec_template, tiers, budget)
    return out
