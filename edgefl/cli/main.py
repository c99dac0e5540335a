"""The ``edgefl`` command. Thin: parse options, call the library, format the output.

Errors: any :class:`EdgeflError` is printed as one red line and exits with the code of its cause
(:class:`edgefl.errors.ExitCode`: 2 usage, 3 configuration, 4 broker unreachable, 5 authentication
refused, 6 run rejected by the server, 7 missing install layer, 130 interrupted, 1 anything else);
``--debug`` shows the traceback instead. Command modules import nothing heavy at import time, so
``edgefl --help`` and the torch-free commands work on the base install.
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import signal
import sys

# torch's intra-op threads (OpenMP) spin while they wait for work by default: on a device that runs
# other services, or a machine running several edgefl processes, the spinning takes the cores the
# other work needs (benchmarks/scale/wait_policy.md). Threads that sleep cost little on an idle
# machine. Read once, when torch loads, so set before any command imports it; a value the user set
# (OMP_WAIT_POLICY=ACTIVE) is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import typer

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
from edgefl.errors import EdgeflError, ExitCode, missing_extra
from edgefl.report.console import err

app = typer.Typer(
    name="edgefl",
    help="Model-heterogeneous federated learning for edge fleets: simulate, deploy over MQTT, "
    "export to ONNX.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"edgefl {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks and debug logs."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log progress details."),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version."
    ),
) -> None:
    from edgefl.report.console import log_handler

    level = logging.DEBUG if debug else logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(message)s", handlers=[log_handler(err)])
    if not debug:
        # the embedded broker logs every refused MQTT 5 probe as a warning, and every client that
        # closes its connection ("No data to decode MQTT packet fixed header") as an ERROR: in a
        # healthy run that is every device leaving at the end. --debug shows them.
        logging.getLogger("amqtt").setLevel(logging.CRITICAL)


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


def _interrupt(signum, frame) -> None:
    # SIGTERM (systemd stop, docker stop) ends a command as Ctrl-C does: finally blocks run,
    # the device leaves the broker cleanly, and the exit code is INTERRUPTED.
    raise KeyboardInterrupt


def _fail(e: EdgeflError) -> None:
    if "--debug" in sys.argv:
        raise e
    from rich.markup import escape

    err.print(
        f"[red]error:[/red] {escape(str(e))}", highlight=False, soft_wrap=True
    )  # "[train]" is text
    sys.exit(int(e.exit_code))


#: The environment variable the shell completion scripts of cli/completion/ set.
COMPLETE_VAR = "_EDGEFL_COMPLETE"


def main() -> None:
    # Last at exit (atexit runs its handlers in reverse): every object alive then is left out of
    # the collections the interpreter makes as it shuts down. With torch loaded they walk millions
    # of objects: 1.1 s of CPU after a `simulate --transport mqtt` of 4 devices, 0.2 s frozen.
    atexit.register(gc.freeze)
    signal.signal(signal.SIGTERM, _interrupt)
    if COMPLETE_VAR in os.environ:  # a <Tab> in a shell with cli/completion/ loaded
        from typer.completion import completion_init

        completion_init()
    try:
        app()  # typer exits 2 on usage errors and 130 on KeyboardInterrupt by itself
    except EdgeflError as e:
        _fail(e)
    except ModuleNotFoundError as e:
        extra = missing_extra(e)
        if extra is None:
            raise
        _fail(extra)
    except KeyboardInterrupt:  # raised outside the command (while typer sets up)
        sys.exit(int(ExitCode.INTERRUPTED))


if __name__ == "__main__":
    main()
