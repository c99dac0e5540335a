"""``edgefl broker``: the embedded broker, and credentials/ACL lines for Mosquitto."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import typer

from edgefl.report.console import err

app = typer.Typer(help="MQTT brokers: run the embedded one; manage Mosquitto device credentials.", no_args_is_help=True)


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


@app.command("ca")
def ca(
    certs: Path = typer.Option(Path("broker/certs"), help="Directory for the CA and the broker's certificate."),
    fleet: str = typer.Option("default", envvar="EDGEFL_FLEET", help="Fleet name (in the CA's name)."),
    host: list[str] = typer.Option(None, "--host", help="Broker host name devices dial (repeatable; default localhost)."),
    ip: list[str] = typer.Option(None, "--ip", help="Broker IP address devices dial (repeatable; default 127.0.0.1)."),
) -> None:
    """Create the fleet CA and the broker's certificate (keys written 0600, never printed)."""
    from edgefl.transport.tls import FleetCA

    authority = FleetCA.create(certs, fleet=fleet)
    crt, key = authority.issue_broker(hosts=host or ["localhost"], ips=ip or ["127.0.0.1"])
    err.print(f"fleet CA {authority.ca_file}; broker certificate {crt} (key {key})")
    err.print("next: edgefl broker add-device NAME --certs " + str(certs) + " for the server and each device")


@app.command("add-device")
def add_device(
    name: str = typer.Argument(..., help="Device id = MQTT username (= certificate common name)."),
    fleet: str = typer.Option("default", envvar="EDGEFL_FLEET", help="The one fleet this account may act in."),
    role: str = typer.Option("device", help="device, server (reads/writes its fleet) or operator (reads its fleet, deploys models)."),
    server: bool = typer.Option(False, "--server", help="Same as --role server."),
    certs: Path = typer.Option(None, help="Issue a client certificate from the fleet CA in this directory instead of a password."),
    password_file: Path = typer.Option(Path("broker/passwd"), help="Mosquitto password file."),
    acl_file: Path = typer.Option(Path("broker/acl"), help="Mosquitto ACL file."),
    password: str = typer.Option(None, help="Password (default: a random one, printed once)."),
) -> None:
    """Create NAME's credentials (a password, or a certificate with --certs) and its fleet-scoped ACL block."""
    from edgefl.transport.broker import add_acl, add_user

    role = "server" if server else role
    if certs is not None:
        from edgefl.transport.tls import FleetCA

        add_acl(acl_file, name, fleet, role=role)  # validates name, fleet and role first
        crt, key = FleetCA.load(certs).issue_client(name)
        err.print(f"added {role} {name} of fleet {fleet} to {acl_file}; certificate {crt} (key {key}); reload mosquitto (SIGHUP)")
        return
    secret = add_user(password_file, acl_file, name, password, fleet=fleet, role=role)
    err.print(f"added {role} {name} of fleet {fleet} to {password_file} and {acl_file}; reload mosquitto (SIGHUP)")
    typer.echo(secret)
