"""``edgefl fleet``: what a fleet is doing, from its server's retained status message or a run
directory."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer

from edgefl.cli.common import Connection, option_groups
from edgefl.report.console import out

app = typer.Typer(help="Look at a running fleet.", no_args_is_help=True)


def _ago(t: float | None, now: float) -> str:
    if not t:
        return "-"
    s = max(0.0, now - float(t))
    return (
        f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f}m ago" if s < 7200 else f"{s / 3600:.0f}h ago"
    )


def _bytes(n: int | None) -> str:
    n = int(n or 0)
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def result_line(result: dict[str, Any]) -> str:
    """The run's result in words: 'result: 71.3% mean accuracy over 3 devices (final
    evaluation)'."""
    acc = result.get("mean_accuracy")
    how = {
        "final-evaluation": "final evaluation",
        "last-round": "each device's last per-round evaluation",
        "mixed": "final evaluation; "
        + ", ".join(
            f"{d} from round {r}" for d, r in sorted((result.get("from_last_round") or {}).items())
        ),
    }
    if acc is None:
        return (
            "result: not measured (no device answered an evaluation in "
            f"{result.get('rounds_completed', 0)} rounds)"
        )
    return (
        f"result: {100 * acc:.1f}% mean accuracy over {result.get('devices')} devices "
        f"({how.get(result.get('measured_by'), result.get('measured_by'))})"
    )


def _where(s: dict[str, Any], now: float) -> str:
    """Where the server's run is: waiting, in a round (and when it closes), or over."""
    phase = s.get("phase")
    if phase == "waiting":
        return (
            f"waiting for devices: {s.get('registered', 0)} of {s.get('expected', '?')} registered"
        )
    if phase in ("finished", "interrupted", "stopped"):
        return f"{phase} after round {s.get('round') or 0} of {s.get('rounds')}"
    deadline = s.get("deadline")
    closes = f", closes in {max(0.0, deadline - now):.0f}s" if deadline else ""
    what = "final evaluation" if s.get("final_evaluation") else phase
    return f"{what} round {s.get('round')} of {s.get('rounds')}{closes}"


def render(status: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    now = float(status.get("time") or time.time())
    s = status.get("server", {})
    conn = f" (server {s['connection']})" if s.get("connection") else ""
    where = _where(s, now)
    out.print(f"fleet [bold]{status.get('fleet')}[/] run {s.get('run')} ({s.get('algorithm')}): "
              f"{where}{conn}; status as of {_ago(now, time.time())}", highlight=False)
    result = s.get("result")
    if isinstance(result, dict):
        out.print(result_line(result), highlight=False)
    privacy = s.get("privacy")
    if isinstance(privacy, dict):
        out.print(
            f"differential privacy {privacy.get('mode')}: budget ε "
            f"{privacy.get('target_epsilon')} at δ {privacy.get('delta')} per device",
            highlight=False,
        )
    table = Table(show_edge=False, pad_edge=False)
    for col in (
        "device",
        "state",
        "tier",
        "model",
        "profile",
        "registered",
        "last seen",
        "last round",
        "up",
        "down",
        "model version",
        "last error",
    ):
        table.add_column(col)
    if isinstance(privacy, dict):
        table.add_column("ε spent")
    colour = {"training": "green", "idle": "cyan", "late": "yellow", "gone": "red"}
    for device_id, d in sorted(status.get("devices", {}).items()):
        p = d.get("profile") or {}
        profile = ", ".join(
            str(x)
            for x in (
                p.get("name"),
                p.get("arch"),
                f"{p['cores']} cores" if "cores" in p else None,
                f"{p['ram_total_mb']} MB" if "ram_total_mb" in p else None,
            )
            if x
        )
        state = d.get("state", "?")
        version = d.get("model_version") or "-"
        if d.get("model_error"):
            version += f" (refused: {d['model_error']})"
        # profiles and refusal reasons come from devices: shown as text, never as markup
        cells = [
            escape(device_id),
            f"[{colour.get(state, 'white')}]{escape(str(state))}[/]",
            escape(str(d.get("tier") or "-")),
            escape(str(d.get("model") or "-")),
            escape(profile or "-"),
            _ago(d.get("registered_at"), now),
            _ago(d.get("last_seen"), now),
            "-" if d.get("last_round") is None else str(d["last_round"]),
            _bytes(d.get("bytes_up")),
            _bytes(d.get("bytes_down")),
            escape(version),
            escape(str(d.get("last_error") or "-")),
        ]
        if isinstance(privacy, dict):
            eps = d.get("epsilon")
            cells.append(f"{eps:.2f}" if isinstance(eps, (int, float)) else "-")
        table.add_row(*cells)
    out.print(table)
    acc = status.get("tier_accuracy") or {}
    if acc:
        out.print(
            "last evaluation: "
            + ", ".join(
                f"tier {t} {100 * a:.1f}%"
                for t, a in sorted(acc.items(), key=lambda x: (len(x[0]), x[0]))
                if a is not None
            ),
            highlight=False,
        )


@app.command("status")
@option_groups
def status(
    conn: Connection = Connection(),
    run: Path = typer.Option(None, help="Read RUN/status.json instead of the broker."),
    timeout: float = typer.Option(5.0, help="Seconds to wait for the retained status."),
    as_json: bool = typer.Option(False, "--json", help="Print the status as JSON."),
) -> None:
    """Devices (tier, model, profile, registration, last seen, last round, bytes, state, model
    version), the server's round and phase, and accuracy per tier."""
    from edgefl.runtime.status_read import read_status_from_broker, read_status_from_run

    if run is not None:
        data = read_status_from_run(run)
    else:
        data = read_status_from_broker(conn.address(), conn.fleet, timeout)
    if as_json:
        typer.echo(json.dumps(data, sort_keys=True))
        return
    render(data)
