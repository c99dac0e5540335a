"""Which model file each device gets (``edgefl deploy``): a run's devices, named, by tier or all,
each its own file from ``edgefl export --run RUN --all`` (int8 on a CPU-only ARM board when one
was exported), or one model file for the named devices. Paths only: ``edgefl.rollout`` sends them.
Torch-free (a run's devices come from its config.json)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgefl.errors import ConfigError
from edgefl.export.errors import ModelFileError

FORMATS = ("auto", "fp32", "int8")


@dataclass(frozen=True)
class Target:
    """One device's part of a rollout: its tier, and the file it gets (None: a rollback)."""

    device: str
    tier: str = ""
    path: Path | None = None
    fmt: str = ""


def pick_file(onnx_dir: Path, device_id: str, fmt: str, profile: dict) -> tuple[Path, str]:
    """The device's exported file in the chosen format; ``auto``: int8 on a CPU-only ARM board, else
    fp32."""
    if fmt == "auto":
        arm = str(profile.get("arch", "")).startswith(("aarch64", "arm"))
        int8 = (onnx_dir / f"{device_id}.int8.onnx").is_file()
        fmt = "int8" if arm and not profile.get("accelerator") and int8 else "fp32"
    path = onnx_dir / (f"{device_id}.int8.onnx" if fmt == "int8" else f"{device_id}.onnx")
    if not path.is_file():
        again = (
            "edgefl export --run RUN --all --out "
            f"{onnx_dir}{' --quantize int8' if fmt == 'int8' else ''}"
        )
        raise ConfigError(f"no exported model {path} ({again})")
    return path, fmt


def run_devices(run_dir: str | Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The run's config and device id → tier, from run_dir/config.json."""
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise ModelFileError(f"{run_dir} is not a run directory (no config.json)")
    try:
        config = json.loads(path.read_text())
        tiers = {d: str(entry["spec"]["tier"]) for d, entry in config["fleet"].items()}
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ModelFileError(f"{path} is not a readable run config: {exc}") from None
    return config, tiers


def _run_fleet(run: Path | None) -> tuple[dict[str, str], dict[str, dict]]:
    """The run's device id → tier and device id → profile (none without a run)."""
    if run is None:
        return {}, {}
    config, tiers = run_devices(run)
    fleet = config.get("fleet", {})
    return tiers, {d: (e.get("profile") or {}) for d, e in fleet.items() if isinstance(e, dict)}


def _named(devices: list[str], tier: str | None, tiers: dict[str, str]) -> list[str]:
    """``--device`` (repeatable), then the run's devices of ``--tier``."""
    targets = list(devices)
    if tier is None:
        return targets
    if not tiers:
        raise ConfigError("--tier needs --run (the run says which device holds which tier)")
    targets += [d for d, t in sorted(tiers.items()) if t == tier and d not in targets]
    if not targets:
        known = ", ".join(sorted(set(tiers.values())))
        raise ConfigError(f"the run has no device of tier {tier!r}; tiers: {known}")
    return targets


def _exported(targets: list[str], folder: Path, say: Callable[[str], None]) -> list[str]:
    """Every device of the run that has an exported model (a fleet run's device that sent no
    final model has none: said, and left out; if none has one, all stay, and the first fails)."""
    def has(d: str) -> bool:
        return (folder / f"{d}.onnx").is_file() or (folder / f"{d}.int8.onnx").is_file()

    missing = [d for d in targets if not has(d)]
    if len(missing) == len(targets):
        return targets
    for d in missing:
        say(
            f"skipping {d}: no exported model in {folder} (edgefl export skipped it: no final "
            "model)"
        )
    return [d for d in targets if d not in missing]


def plan(*, run: Path | None = None, onnx_dir: Path | None = None, model: Path | None = None,
         devices: list[str] | None = None, tier: str | None = None, fmt: str = "auto",
         rollback: bool = False, say: Callable[[str], None] = print) -> list[Target]:
    """The devices a rollout addresses and the file each gets (``rollback``: no files)."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: choose fp32, int8 or auto")
    tiers, profiles = _run_fleet(run)
    targets = _named(devices or [], tier, tiers)
    folder = onnx_dir or (Path(run) / "onnx" if run is not None else None)
    if not targets:
        if not tiers:
            raise ConfigError(
                "name the devices: --device ID (repeatable), --tier T with --run, or --run for all"
            )
        targets = sorted(tiers)
        if not rollback and model is None:
            targets = _exported(targets, folder, say)
    if rollback:
        return [Target(d, tiers.get(d, "")) for d in targets]
    if (model is None) == (run is None):
        raise ConfigError("give --run RUN (its exported models) or --model FILE --device ID")
    if model is None:
        return [
            Target(d, tiers.get(d, ""), *pick_file(folder, d, fmt, profiles.get(d, {})))
            for d in targets
        ]
    if not Path(model).is_file():
        raise ConfigError(f"no model file {model}")
    chosen = "int8" if ".int8." in Path(model).name else "fp32"
    return [Target(d, tiers.get(d, ""), Path(model), chosen) for d in targets]
