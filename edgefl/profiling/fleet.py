"""Reference profiles and fleet files: device ids with their profiles and the fleet's tier
budget."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgefl.errors import ConfigError
from edgefl.profiling.profile import DeviceProfile
from edgefl.profiling.tiers import TierBudget, choose_tier

if TYPE_CHECKING:
    from edgefl.models import ModelSpec


@dataclass(frozen=True)
class Fleet:
    """A fleet file loaded: device ids with their profiles, and the fleet's tier budget.

    ``budget`` holds the TierBudget fields the file sets (``memory_fraction``, ``round_seconds``,
    ``samples_per_round``, ...); a run fills in the rest (its batch size, its samples per round).
    """

    devices: tuple[tuple[str, DeviceProfile], ...]
    budget: dict[str, Any]
    path: str = ""

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
        devices:
          - {id: pi4, profile: raspberry-pi-4, count: 3}       # → pi4-0, pi4-1, pi4-2
          - {id: laptop, profile: ./x86-laptop.yaml}           # count 1 → laptop

    ``profile`` names a YAML file next to the fleet file (".yaml" may be left out) or holds the
    profile's fields inline.
    """
    path = Path(path)
    data = _yaml(path)
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("devices"), list)
        or not data["devices"]
    ):
        raise ConfigError(f"fleet file {path} needs a non-empty 'devices' list")
    unknown = sorted(set(data) - {"budget", "devices", "description"})
    if unknown:
        raise ConfigError(f"fleet file {path}: unknown keys {', '.join(unknown)}")
    budget = dict(data.get("budget") or {})
    bad = sorted(set(budget) - _BUDGET_KEYS)
    if bad:
        raise ConfigError(f"fleet file {path}: unknown budget keys {', '.join(bad)}")
    TierBudget(**budget)  # validate now, not in the middle of a run
    devices: list[tuple[str, DeviceProfile]] = []
    for entry in data["devices"]:
        if not isinstance(entry, dict) or "id" not in entry or "profile" not in entry:
            raise ConfigError(
                f"fleet file {path}: each device needs 'id' and 'profile', got {entry!r}"
            )
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
    ids = [d for d, _ in devices]
    duplicates = sorted({d for d in ids if ids.count(d) > 1})
    if duplicates:
        raise ConfigError(f"fleet file {path}: duplicate device ids {', '.join(duplicates)}")
    return Fleet(tuple(devices), budget, str(path))


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
