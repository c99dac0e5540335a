"""The ``edgefl`` command. Thin: parse options, call the library, format the output.

Errors: any :class:`EdgeflError` is printed as one red line and exits 1; ``--debug`` shows the
traceback instead.
"""

from __future__ import annotations

import logging
import sys

import typer
from rich.console import Console

from edgefl import __version__
from edgefl.cli import broker as broker_cmd
from edgefl.cli import dashboard as dashboard_cmd
from edgefl.cli import deploy as deploy_cmd
from edgefl.cli import device as device_cmd
from edgefl.cli import export as export_cmd
from edgefl.cli import fleet as fleet_cmd
from edgefl.cli import infer as infer_cmd
from edgefl.cli import server as server_cmd
from edgefl.cli import simulate as simulate_cmd
from edgefl.cli import train as train_cmd
from edgefl.errors import EdgeflError

app = typer.Typer(
    name="edgefl",
    help="Model-heterogeneous federated learning for edge fleets: simulate, deploy over MQTT, export to ONNX.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
err = Console(stderr=True)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"edgefl {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks and debug logs."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log progress details."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    from rich.logging import RichHandler

    level = logging.DEBUG if debug else logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(message)s", handlers=[RichHandler(console=err, show_path=False)])
    if not debug:  # the embedded broker logs every refused MQTT 5 probe as a warning
        logging.getLogger("amqtt").setLevel(logging.ERROR)


app.command("simulate")(simulate_cmd.simulate)
app.add_typer(device_cmd.app, name="device")
app.add_typer(broker_cmd.app, name="broker")
app.add_typer(server_cmd.app, name="server")
app.add_typer(fleet_cmd.app, name="fleet")
app.command("dashboard")(dashboard_cmd.dashboard)
app.command("deploy")(deploy_cmd.deploy)
app.command("train")(train_cmd.train)
app.command("export")(export_cmd.export)
app.command("infer")(infer_cmd.infer)


def main() -> None:
    try:
        app()
    except EdgeflError as e:
        if "--debug" in sys.argv:
            raise
        err.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
