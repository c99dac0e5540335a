"""``edgefl deploy``: put exported models on devices (or return them to the previous version)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from edgefl.cli.common import (
    DEFAULT_BROKER,
    Broker,
    CaFile,
    CertFile,
    Fleet,
    KeyFile,
    Password,
    PasswordFile,
    Username,
    connection_address,
)
from edgefl.report.console import err


def _pick_file(onnx_dir: Path, device_id: str, fmt: str, profile: dict) -> tuple[Path, str]:
    """The device's exported file in the chosen format; ``auto``: int8 on a CPU-only ARM board, else fp32."""
    from edgefl.errors import ConfigError

    if fmt == "auto":
        arm = str(profile.get("arch", "")).startswith(("aarch64", "arm"))
        fmt = "int8" if arm and not profile.get("accelerator") and (onnx_dir / f"{device_id}.int8.onnx").is_file() else "fp32"
    path = onnx_dir / (f"{device_id}.int8.onnx" if fmt == "int8" else f"{device_id}.onnx")
    if not path.is_file():
        raise ConfigError(f"no exported model {path} (edgefl export --run RUN --all --out {onnx_dir}{' --quantize int8' if fmt == 'int8' else ''})")
    return path, fmt


def deploy(
    run: Path = typer.Option(None, "--run", help="Deploy each device of this run its exported model (RUN/onnx by default)."),
    onnx_dir: Path = typer.Option(None, "--onnx-dir", help="Where `edgefl export --run RUN --all` wrote the models."),
    model: Path = typer.Option(None, "--model", help="Deploy this ONNX file (with --device)."),
    device: list[str] = typer.Option(None, "--device", help="Only this device (repeatable)."),
    tier: str = typer.Option(None, "--tier", help="Only the run's devices of this tier."),
    fmt: str = typer.Option("auto", "--format", help="fp32, int8, or auto (int8 on CPU-only ARM devices when exported)."),
    version: str = typer.Option(None, "--version", help="Version name (default: the run or file name and the time)."),
    rollback: bool = typer.Option(False, "--rollback", help="Return the devices to their previous version."),
    wait: float = typer.Option(30.0, help="Seconds to wait for the devices' reports (0: do not wait)."),
    broker: Broker = DEFAULT_BROKER,
    fleet: Fleet = "default",
    username: Username = None,
    password: Password = None,
    password_file: PasswordFile = None,
    ca_file: CaFile = None,
    cert_file: CertFile = None,
    key_file: KeyFile = None,
    as_json: bool = typer.Option(False, "--json", help="Print the devices' reports as JSON."),
) -> None:
    """Publish each device its model (versioned, with a SHA-256 digest); devices check, install and report."""
    from edgefl.errors import ConfigError
    from edgefl.rollout import deploy_command, encode_command, publish_commands, rollback_command

    if fmt not in ("auto", "fp32", "int8"):
        raise ConfigError(f"--format {fmt!r}: choose fp32, int8 or auto")
    tiers: dict[str, str] = {}
    profiles: dict[str, dict] = {}
    if run is not None:
        from edgefl.export.run import run_devices

        config, tiers = run_devices(run)
        profiles = {d: (e.get("profile") or {}) for d, e in config.get("fleet", {}).items() if isinstance(e, dict)}
    targets = list(device or [])
    if tier is not None:
        if not tiers:
            raise ConfigError("--tier needs --run (the run says which device holds which tier)")
        targets += [d for d, t in sorted(tiers.items()) if t == tier and d not in targets]
        if not targets:
            raise ConfigError(f"the run has no device of tier {tier!r}; tiers: {', '.join(sorted(set(tiers.values())))}")
    if not targets:
        if not tiers:
            raise ConfigError("name the devices: --device ID (repeatable), --tier T with --run, or --run for all")
        targets = sorted(tiers)
        if not rollback and model is None:
            # every device of the run that has an exported model (a fleet run's device that sent
            # no final model has none: said, and left out)
            folder = onnx_dir or Path(run) / "onnx"
            missing = [d for d in targets if not (folder / f"{d}.onnx").is_file() and not (folder / f"{d}.int8.onnx").is_file()]
            if len(missing) < len(targets):
                for d in missing:
                    err.print(f"[yellow]skipping[/] {d}: no exported model in {folder} (edgefl export skipped it: no final model)", highlight=False)
                targets = [d for d in targets if d not in missing]
    messages: dict[str, bytes] = {}
    expect: dict[str, str] = {}
    if rollback:
        for d in targets:
            messages[d] = encode_command(rollback_command(fleet, d))
            expect[d] = "*"  # the device knows its previous version: any fresh report answers
    else:
        if (model is None) == (run is None):
            raise ConfigError("give --run RUN (its exported models) or --model FILE --device ID")
        stamp = time.strftime("%Y%m%d%H%M%S")
        for d in targets:
            if model is not None:
                path, chosen = Path(model), ("int8" if ".int8." in Path(model).name else "fp32")
                if not path.is_file():
                    raise ConfigError(f"no model file {path}")
            else:
                path, chosen = _pick_file(onnx_dir or Path(run) / "onnx", d, fmt, profiles.get(d, {}))
            name = version or f"{(run.name if run is not None else path.name.split('.')[0])}-{stamp}"
            data = path.read_bytes()
            command = deploy_command(fleet, d, data, version=name, tier=tiers.get(d, ""), fmt=chosen)
            messages[d] = encode_command(command, data)
            expect[d] = name
            err.print(f"{d}: {path} ({chosen}, {len(data)} bytes) as version {name}", highlight=False)
    address = connection_address(broker, username, password, ca_file, cert_file, key_file, password_file)
    reports = publish_commands(address, fleet, messages, wait=wait, expect=expect)
    if as_json:
        typer.echo(json.dumps(reports, sort_keys=True))
        return
    from rich.markup import escape

    for d, r in sorted(reports.items()):
        if r.get("error") and "version" not in r:  # no report: offline, never connected, or silent
            err.print(f"{d}: [red]{escape(r['error'])}[/]", soft_wrap=True)
        elif r.get("error"):
            err.print(f"{d}: [red]refused: {escape(str(r['error']))}[/] (active: {escape(str(r.get('version')))})", soft_wrap=True)
        else:
            err.print(f"{d}: [green]active[/] version {escape(str(r.get('version')))}", soft_wrap=True)
    failed = [d for d, r in reports.items() if r.get("error") or expect[d] not in ("*", r.get("version"))]
    if failed:
        from edgefl.errors import EdgeflError

        refused = [d for d in failed if "version" in reports[d]]  # the device answered and said no: exit 3
        error = ConfigError if refused else EdgeflError  # none answered (offline, silent): exit 1, try again later
        raise error(f"{len(failed)} of {len(reports)} devices did not take the model: {', '.join(sorted(failed))}")
