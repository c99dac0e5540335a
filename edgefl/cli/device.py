"""``edgefl device …``: commands run on a device of the fleet.

edgefl device profile [--json] [--quick]    measure this device (what registration sends)
edgefl device register --device-id ID ...   send the profile to a server, print the assigned model
"""

from __future__ import annotations

import json

import typer
from rich.table import Table

from edgefl.cli.common import (
    Connection,
    DeviceId,
    Tier,
    load_profile,
    option_groups,
    serve_models,
)
from edgefl.report.console import out

app = typer.Typer(
    help="Commands run on a device: profile it, register it with a server.", no_args_is_help=True
)


@app.command("profile")
def profile(
    as_json: bool = typer.Option(False, "--json", help="Print the profile as one JSON object."),
    quick: bool = typer.Option(False, "--quick", help="A shorter compute benchmark (about 0.5 s)."),
    name: str = typer.Option(None, help="Name recorded in the profile (default: host name)."),
) -> None:
    """Detect this device (CPU, RAM, board, accelerator) and measure its training throughput."""
    from edgefl.profiling import profile_device

    result = profile_device(quick=quick, name=name)
    if as_json:
        typer.echo(json.dumps(result.to_dict()))
        return
    table = Table(title=f"device profile: {result.name}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for key, value in result.to_dict().items():
        if key != "name" and value not in (None, ""):
            table.add_row(key, str(value))
    out.print(table)


@app.command("register")
@option_groups
def register(
    device_id: DeviceId,
    conn: Connection = Connection(),
    tier: Tier = None,
    profile_file: str = typer.Option(
        None, "--profile", help="Profile JSON; default: measure this machine."
    ),
    timeout: float = typer.Option(60.0, help="Seconds to wait for the server's answer."),
    as_json: bool = typer.Option(False, "--json", help="Print the assignment as JSON."),
) -> None:
    """Send this device's profile to the fleet's server and print the model it assigns (then
    exit)."""
    from edgefl.models.spec import ModelSpec
    from edgefl.runtime.device import register_once

    meta = register_once(
        **conn.options(),
        device_id=device_id,
        tier=tier,
        profile=load_profile(profile_file),
        timeout=timeout,
    )
    if as_json:
        typer.echo(json.dumps(meta))
        return
    spec = ModelSpec.from_dict(json.loads(meta["spec"]))
    out.print(
        f"[bold green]registered[/] {device_id} with server {meta['epoch']}: {spec.name} for "
        f"{meta['algorithm']}, {meta['rounds']} rounds"
    )


@app.command("agent")
@option_groups
def agent(
    device_id: DeviceId,
    conn: Connection = Connection(),
    models_dir: str = typer.Option(
        None,
        envvar="EDGEFL_MODELS_DIR",
        help="Where models are kept (default ~/.local/share/edgefl/models).",
    ),
    input_shape: str = typer.Option(
        None, help="Refuse models whose input is not C,H,W (default: that of the active model)."
    ),
) -> None:
    """Receive model rollouts (edgefl deploy) until stopped: check, install, keep the previous
    version, report. One line per install, rollback or refused model."""
    import sys

    def say(line: str) -> None:
        typer.echo(f"[{device_id}] {line}")
        sys.stdout.flush()

    serve_models(conn.address(), conn.fleet, device_id, models_dir, input_shape, say)
