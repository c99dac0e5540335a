"""``edgefl train``: run this machine as one device of a fleet until the server ends the run."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

err = Console(stderr=True)


def load_profile(path: Path | None) -> dict | None:
    if path is None:
        return None
    from edgefl.errors import ConfigError

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"cannot read the profile {path}: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"profile {path} is not a JSON object")
    return data


def train(
    broker: str = typer.Option("mqtt://127.0.0.1:1883", help="Broker URL: mqtt[s]://[user:pass@]host[:port]."),
    fleet: str = typer.Option("default", help="Fleet name (topics edgefl/<fleet>/...)."),
    device_id: str = typer.Option(..., "--device-id", help="This device's id (also its MQTT username)."),
    data: str = typer.Option(..., help="Dataset[:shard=I/N,partition=dirichlet,alpha=0.5,seed=0,train_samples=...]."),
    tier: str = typer.Option(None, help="Ask for this tier instead of the server's profile-based choice."),
    profile: Path = typer.Option(None, help="Profile JSON (edgefl device profile --json); default: measure this machine."),
    username: str = typer.Option(None, help="MQTT username (default: from the URL)."),
    password: str = typer.Option(None, envvar="EDGEFL_MQTT_PASSWORD", help="MQTT password (or EDGEFL_MQTT_PASSWORD)."),
    ca_file: str = typer.Option(None, envvar="EDGEFL_CA_FILE", help="TLS: the fleet CA certificate (mqtts://)."),
    cert_file: str = typer.Option(None, envvar="EDGEFL_CERT_FILE", help="TLS: this client's certificate (edgefl broker add-device --certs)."),
    key_file: str = typer.Option(None, envvar="EDGEFL_KEY_FILE", help="TLS: this client's private key."),
    delay: float = typer.Option(0.0, help="Extra seconds per training round (emulate a slow device)."),
    max_bytes: int = typer.Option(256 * 1024 * 1024, help="Largest message accepted or sent."),
    threads: int = typer.Option(None, help="Torch CPU threads."),
    save_model: Path = typer.Option(None, help="When the run is over, save the final model here (.safetensors)."),
    export: Path = typer.Option(None, help="When the run is over, export the final model to this ONNX file."),
    models_dir: str = typer.Option(None, "--models-dir", help="When the run is over, stay as the model agent (edgefl device agent) with this store."),
) -> None:
    """Serve rounds for a fleet's server; reconnects by itself; exits when the run is over."""
    from edgefl.runtime.device import DeviceOptions, run_device

    opts = DeviceOptions(
        broker=broker,
        device_id=device_id,
        data=data,
        fleet=fleet,
        tier=tier,
        profile=load_profile(profile),
        username=username,
        password=password,
        ca_file=ca_file,
        cert_file=cert_file,
        key_file=key_file,
        delay=delay,
        max_bytes=max_bytes,
        threads=threads,
        save_model=str(save_model) if save_model else None,
        export=str(export) if export else None,
    )
    served = run_device(opts)
    err.print(f"[bold green]done[/] device {device_id}: served {served} requests")
    if models_dir:  # the run is over: receive the deployed model (edgefl deploy) until stopped
        from edgefl.cli.device import agent

        agent(broker=broker, fleet=fleet, device_id=device_id, models_dir=models_dir, input_shape=None, username=username,
              password=password, ca_file=ca_file, cert_file=cert_file, key_file=key_file)
