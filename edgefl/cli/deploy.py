"""``edgefl deploy``: put exported models on devices (or return them to the previous version)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from edgefl.cli.common import Connection, option_groups
from edgefl.report.console import err


@option_groups
def deploy(
    run: Path = typer.Option(
        None,
        help="Deploy each device of this run its exported model (RUN/onnx by default).",
    ),
    onnx_dir: Path = typer.Option(
        None, help="Where `edgefl export --run RUN --all` wrote the models."
    ),
    model: Path = typer.Option(None, help="Deploy this ONNX file (with --device)."),
    device: list[str] = typer.Option(None, help="Only this device (repeatable)."),
    tier: str = typer.Option(None, help="Only the run's devices of this tier."),
    fmt: str = typer.Option(
        "auto", "--format", help="fp32, int8, or auto (int8 on CPU-only ARM devices when exported)."
    ),
    version: str = typer.Option(
        None, help="Version name (default: the run or file name and the time)."
    ),
    rollback: bool = typer.Option(
        False, "--rollback", help="Return the devices to their previous version."
    ),
    wait: float = typer.Option(
        30.0, help="Seconds to wait for the devices' reports (0: do not wait)."
    ),
    conn: Connection = Connection(),
    as_json: bool = typer.Option(False, "--json", help="Print the devices' reports as JSON."),
) -> None:
    """Publish each device its model (versioned, with a SHA-256 digest); devices check, install and
    report."""
    from edgefl.export.deployment import plan
    from edgefl.rollout import check_reports, publish_commands, rollout_messages

    targets = plan(
        run=run,
        onnx_dir=onnx_dir,
        model=model,
        devices=device,
        tier=tier,
        fmt=fmt,
        rollback=rollback,
        say=_say,
    )
    stem = run.name if run is not None else Path(model or "").name.split(".")[0]
    name = version or f"{stem}-{time.strftime('%Y%m%d%H%M%S')}"
    messages, expect = rollout_messages(conn.fleet, targets, version=name, say=_say)
    reports = publish_commands(conn.address(), conn.fleet, messages, wait=wait, expect=expect)
    if as_json:  # the reports say it all: exit 0
        typer.echo(json.dumps(reports, sort_keys=True))
        return
    for d, r in sorted(reports.items()):
        err.print(f"{d}: {_outcome(r)}", soft_wrap=True)
    check_reports(reports, expect)


def _say(line: str) -> None:
    err.print(line, highlight=False, markup=False)  # file names and versions are text


def _outcome(report: dict) -> str:
    from rich.markup import escape

    if (
        report.get("error") and "version" not in report
    ):  # no report: offline, never connected, or silent
        return f"[red]{escape(report['error'])}[/]"
    if report.get("error"):
        return (
            f"[red]refused: {escape(str(report['error']))}[/] (active: "
            f"{escape(str(report.get('version')))})"
        )
    return f"[green]active[/] version {escape(str(report.get('version')))}"
