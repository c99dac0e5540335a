"""``edgefl broker``: the embedded broker, and credentials/ACL lines for Mosquitto."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import typer

from edgefl.report.console import err

app = typer.Typer(
    help="MQTT brokers: run the embedded one; manage Mosquitto device credentials.",
    no_args_is_help=True,
)


@app.command("start")
def start(
    port: int = typer.Option(1883, help="Port on 127.0.0.1 (0: a free one)."),
) -> None:
    """Run the embedded amqtt broker (MQTT 3.1.1, loopback only, anonymous) until Ctrl-C."""
    from edgefl.transport.broker import EmbeddedBroker

    broker = EmbeddedBroker(port=port).start()
    # SIGTERM raises KeyboardInterrupt, as Ctrl-C does: no handler that takes a lock the
    # interrupted main thread may hold (edgefl.runtime.interrupt), and sleep() wakes for either
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:  # said only once a signal stops it here (a signal before this line exited 130)
        err.print(f"[bold green]embedded broker[/] listening on {broker.url} (Ctrl-C to stop)")
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        broker.stop()


@app.command("ca")
def ca(
    certs: Path = typer.Option(
        Path("broker/certs"), help="Directory for the CA and the broker's certificate."
    ),
    fleet: str = typer.Option(
        "default", envvar="EDGEFL_FLEET", help="Fleet name (in the CA's name)."
    ),
    host: list[str] = typer.Option(
        None, help="Broker host name devices dial (repeatable; default localhost)."
    ),
    ip: list[str] = typer.Option(
        None, help="Broker IP address devices dial (repeatable; default 127.0.0.1)."
    ),
) -> None:
    """Create the fleet CA and the broker's certificate (keys written 0600, never printed; run as
    root, the broker's key belongs to the mosquitto user, as Mosquitto reads it as that user)."""
    from edgefl.transport.tls import FleetCA

    authority = FleetCA.create(certs, fleet=fleet)
    crt, key = authority.issue_broker(hosts=host or ["localhost"], ips=ip or ["127.0.0.1"])
    err.print(f"fleet CA {authority.ca_file}; broker certificate {crt} (key {key})", soft_wrap=True)
    err.print(
        f"next, for the server and each device: edgefl broker add-device NAME --fleet {fleet} "
        f"--certs {certs}",
        soft_wrap=True,
    )
    _warn_unreachable(key)


@app.command("add-device")
def add_device(
    name: str = typer.Argument(..., help="Device id = MQTT username (= certificate common name)."),
    fleet: str = typer.Option(
        "default", envvar="EDGEFL_FLEET", help="The one fleet this account may act in."
    ),
    role: str = typer.Option(
        "device",
        help="device, server (reads/writes its fleet) or operator (reads its fleet, deploys "
        "models).",
    ),
    server: bool = typer.Option(False, "--server", help="Same as --role server."),
    certs: Path = typer.Option(
        None,
        help="Issue a client certificate from the fleet CA in this directory instead of a "
        "password.",
    ),
    password_file: Path = typer.Option(Path("broker/passwd"), help="Mosquitto password file."),
    acl_file: Path = typer.Option(
        Path("broker/acl"),
        help="Mosquitto ACL file (its directory also gets data/, Mosquitto's "
        "persistence_location).",
    ),
    password: str = typer.Option(None, help="Password (default: a random one, printed once)."),
    force: bool = typer.Option(
        False,
        "--force",
        help="Replace an existing account: its password (or certificate and key) and its ACL "
        "block.",
    ),
) -> None:
    """Create NAME's credentials (a password, or a certificate with --certs) and its fleet-scoped
    ACL block. Run as root, the files Mosquitto reads belong to the mosquitto user."""
    from edgefl.transport.accounts import add_user, persistence_dir

    role = "server" if server else role
    if certs is not None:
        where = _add_certificate(name, fleet, role, certs, acl_file, force)
    else:
        secret = add_user(
            password_file, acl_file, name, password, fleet=fleet, role=role, replace=force
        )
        where = f"{password_file} and {acl_file}"
    persistence_dir(acl_file.parent / "data")
    err.print(f"added {role} {name} of fleet {fleet} to {where}; reload mosquitto (SIGHUP)",
              soft_wrap=True)
    _warn_unreachable(acl_file)
    if certs is None:
        typer.echo(secret)


def _add_certificate(name: str, fleet: str, role: str, certs: Path, acl_file: Path,
                     force: bool) -> str:
    """Issue NAME a client certificate from the fleet CA in ``certs`` and add its ACL block: what
    was written, as add-device says it."""
    from edgefl.errors import ConfigError
    from edgefl.transport.accounts import acl_block, add_acl, existing_account
    from edgefl.transport.tls import FleetCA

    acl_block(name, fleet, role=role)  # validates name, fleet and role first
    authority = FleetCA.load(certs)
    crt_path, key_path = Path(certs) / f"{name}.crt", Path(certs) / f"{name}.key"
    found = existing_account(None, acl_file, name) + [str(p) for p in (key_path,) if p.exists()]
    if found and not force:
        raise ConfigError(
            f"{name} already has an account ({', '.join(found)}); --force issues a new "
            "certificate and key and replaces its ACL block"
        )
    if force:
        crt_path.unlink(missing_ok=True)
        key_path.unlink(missing_ok=True)
    crt, key = authority.issue_client(name)
    add_acl(acl_file, name, fleet, role=role, replace=force)
    return f"{acl_file}; certificate {crt} (key {key})"


def _warn_unreachable(path: Path) -> None:
    from edgefl.transport.accounts import mosquitto_blocked_by

    blocked = mosquitto_blocked_by(path)
    if blocked is not None:
        err.print(
            f"[yellow]warning:[/] Mosquitto started as root reads {path} as the mosquitto user, "
            "which cannot enter "
            f"{blocked} (mode {blocked.stat().st_mode & 0o777:o}): keep the broker's files "
            "elsewhere, e.g. /var/lib/edgefl-broker "
            "(docs/deployment.md)",
            soft_wrap=True,
            highlight=False,
        )
