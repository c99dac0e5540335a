"""``edgefl dashboard``: the fleet status as a live web page."""

from __future__ import annotations

from pathlib import Path

import typer

from edgefl.cli.common import Connection, option_groups
from edgefl.report.console import err


@option_groups
def dashboard(
    conn: Connection = Connection(),
    run: Path = typer.Option(None, help="Follow RUN/status.json instead of the broker."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on (loopback by default)."),
    port: int = typer.Option(8080, help="Port (0: a free one)."),
    web_password: str = typer.Option(
        None,
        envvar="EDGEFL_DASHBOARD_PASSWORD",
        help="Require this password (HTTP basic authentication, any user name).",
    ),
    reference: Path = typer.Option(
        None,
        help="Draw this finished run's accuracy (its Local reference if it has one) "
        "as a dashed line; with --run, that run's Local reference is drawn by default.",
    ),
) -> None:
    """Serve a live page of the fleet: the run's state and result, devices and liveness, accuracy
    per tier, bytes per round; /metrics for Prometheus."""
    from edgefl.dashboard import reference_from_run, run_dashboard
    from edgefl.errors import ConfigError

    if host not in ("127.0.0.1", "localhost", "::1") and not web_password:
        err.print(
            "[yellow]warning:[/] the dashboard listens beyond loopback without a password "
            "(--web-password)"
        )
    ref = None
    if reference is not None:
        ref = reference_from_run(reference)
        if ref is None:
            raise ConfigError(
                f"--reference {reference}: no finished run there (summary.json is missing or "
                "unreadable)"
            )
    elif run is not None:
        ref = reference_from_run(run, local_only=True)
    if run is not None:
        from edgefl.errors import EdgeflError
        from edgefl.runtime.status_read import read_status_from_run

        def source():
            try:
                return read_status_from_run(run)
            except EdgeflError:
                return None

        feed = None
    else:
        from edgefl.runtime.status_read import StatusFeed

        feed = StatusFeed(conn.address(), conn.fleet).start()
        source = feed.latest
    try:
        run_dashboard(
            source,
            host=host,
            port=port,
            password=web_password,
            reference=ref,
            on_ready=lambda url: err.print(
                f"dashboard on {url} (Ctrl-C to stop)", highlight=False, soft_wrap=True
            ),
        )
    finally:
        if feed is not None:
            feed.stop()
