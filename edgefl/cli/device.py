"""``edgefl device …``: commands run on a device of the fleet.

edgefl device profile [--json] [--quick]    measure this device (what registration sends)
edgefl device register --device-id ID ...   send the profile to a server, print the assigned model
"""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    help="Commands run on a device: profile it, register it with a server.", no_args_is_help=True
)
out = Console()


@app.command("profile")
def profile(
    as_json: bool = typer.Option(False, "--json", help="Print the profile as one JSON object."),
    quick: bool = typer.Option(False, "--quick", help="A shorter compute benchmark (about 0.5 s)."),
    name: str = typer.Option(
        None, "--name", help="Name recorded in the profile (default: host name)."
    ),
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
def register(
    broker: str = typer.Option("mqtt://127.0.0.1:1883", envvar="EDGEFL_BROKER", help="Broker URL: mqtt[s]://[user:pass@]host[:port]."),
    fleet: str = typer.Option("default", envvar="EDGEFL_FLEET", help="Fleet name."),
    device_id: str = typer.Option(..., "--device-id", envvar="EDGEFL_DEVICE_ID", help="This device's id (also its MQTT username)."),
    tier: str = typer.Option(None, help="Ask for this tier instead of the server's profile-based choice."),
    profile_file: str = typer.Option(None, "--profile", help="Profile JSON; default: measure this machine."),
    username: str = typer.Option(None, envvar="EDGEFL_USERNAME", help="MQTT username (default: from the URL)."),
    password: str = typer.Option(None, envvar=["EDGEFL_PASSWORD", "EDGEFL_MQTT_PASSWORD"], help="MQTT password."),
    timeout: float = typer.Option(60.0, help="Seconds to wait for the server's answer."),
    as_json: bool = typer.Option(False, "--json", help="Print the assignment as JSON."),
) -> None:
    """Send this device's profile to the fleet's server and print the model it assigns (then exit)."""
    from edgefl.cli.common import load_profile
    from edgefl.models.spec import ModelSpec
    from edgefl.runtime.device import register_once

    meta = register_once(
        broker=broker, fleet=fleet, device_id=device_id, tier=tier, profile=load_profile(profile_file),
        username=username, password=password, timeout=timeout,
    )
    if as_json:
        typer.echo(json.dumps(meta))
        return
    spec = ModelSpec.from_dict(json.loads(meta["spec"]))
    out.print(f"[bold green]registered[/] {device_id} with server {meta['epoch']}: {spec.name} for {meta['algorithm']}, {meta['rounds']} rounds")


@app.command("agent")
def agent(
    broker: str = typer.Option("mqtt://127.0.0.1:1883", envvar="EDGEFL_BROKER", help="Broker URL: mqtt[s]://[user:pass@]host[:port]."),
    fleet: str = typer.Option("default", envvar="EDGEFL_FLEET", help="Fleet name."),
    device_id: str = typer.Option(..., "--device-id", envvar="EDGEFL_DEVICE_ID", help="This device's id (its MQTT username)."),
    models_dir: str = typer.Option(None, envvar="EDGEFL_MODELS_DIR", help="Where models are kept (default ~/.local/share/edgefl/models)."),
    input_shape: str = typer.Option(None, help="Refuse models whose input is not C,H,W (default: that of the active model)."),
    username: str = typer.Option(None, envvar="EDGEFL_USERNAME", help="MQTT username (default: from the URL)."),
    password: str = typer.Option(None, envvar=["EDGEFL_PASSWORD", "EDGEFL_MQTT_PASSWORD"], help="MQTT password."),
    ca_file: str = typer.Option(None, envvar="EDGEFL_CA_FILE", help="TLS: the fleet CA certificate."),
    cert_file: str = typer.Option(None, envvar="EDGEFL_CERT_FILE", help="TLS: this device's certificate."),
    key_file: str = typer.Option(None, envvar="EDGEFL_KEY_FILE", help="TLS: this device's private key."),
) -> None:
    """Receive model rollouts (edgefl deploy) until stopped: check, install, keep the previous version, report."""
    import signal
    import threading

    from edgefl.cli.fleet import connection_address
    from edgefl.errors import ConfigError
    from edgefl.rollout import ModelStore, run_agent
    from edgefl.rollout import models_dir as resolve_models_dir
    from edgefl.transport.broker import check_device_id

    check_device_id(device_id)
    shape = None
    if input_shape:
        try:
            shape = [int(v) for v in input_shape.split(",")]
        except ValueError:
            raise ConfigError(f"--input-shape {input_shape!r}: give C,H,W, e.g. 1,28,28") from None
    store = ModelStore(resolve_models_dir(models_dir), expected_input_shape=shape)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    address = connection_address(broker, username, password, ca_file, cert_file, key_file)
    err = Console(stderr=True)
    err.print(f"model agent of {device_id} in fleet {fleet}: {store.dir} (active: {(store.active() or {}).get('version')})", highlight=False)
    try:
        run_agent(address, fleet, device_id, store, stop=stop)
    except KeyboardInterrupt:
        pass
