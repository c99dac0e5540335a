"""``edgefl broker``: the embedded broker, and credentials/ACL lines for Mosquitto."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import typer
from rich.console import Console

app = typer.Typer(help="MQTT brokers: run the embedded one; manage Mosquitto device credentials.", no_args_is_help=True)
err = Console(stderr=True)


@app.command("start")
def start(
    port: int = typer.Option(1883, help="Port on 127.0.0.1 (0: a free one)."),
) -> None:
    """Run the embedded amqtt broker (MQTT 3.1.1, loopback only, anonymous) until Ctrl-C."""
    from edgefl.transport.broker import EmbeddedBroker

    broker = EmbeddedBroker(port=port).start()
    err.print(f"[bold green]embedded broker[/] listening on {broker.url} (Ctrl-C to stop)")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        broker.stop()


@app.command("add-device")
def add_device(
    name: str = typer.Argument(..., help="Device id = MQTT username."),
    password_file: Path = typer.Option(Path("broker/passwd"), help="Mosquitto password file."),
    acl_file: Path = typer.Option(Path("broker/acl"), help="Mosquitto ACL file."),
    password: str = typer.Option(None, help="Password (default: a random one, printed once)."),
    server: bool = typer.Option(False, "--server", help="Create the server's account (reads/writes edgefl/#)."),
) -> None:
    """Create NAME's password (mosquitto_passwd) and ACL block: it may write only under its own id."""
    from edgefl.transport.broker import add_user

    secret = add_user(password_file, acl_file, name, password, server=server)
    err.print(f"added {'server' if server else 'device'} {name} to {password_file} and {acl_file}; reload mosquitto (SIGHUP)")
    typer.echo(secret)
