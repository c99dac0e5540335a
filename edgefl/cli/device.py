"""``edgefl device …``: commands run on a device of the fleet.

edgefl device profile [--json] [--quick]    measure this device (what registration sends)
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
