"""``edgefl dashboard``: a live web page of a fleet (aiohttp; server-sent events; no assets from
the internet, so it works offline).

    run_dashboard(source, host="127.0.0.1", port=8080, password=None, reference=None)

``source`` is a callable returning the latest fleet status (a
:class:`~edgefl.runtime.status_read.StatusFeed` over the broker, or a run directory's
``status.json``).
The page (``page.html`` with ``page.js`` and ``page.css``) opens ``/events`` and redraws on every
status: the run's state and result, devices and their liveness, accuracy per tier per round, bytes
per round. ``reference`` (Local, or a previous run: :func:`reference_from_run`) is drawn as a dashed
line. ``/metrics`` serves the same numbers to Prometheus (:mod:`edgefl.report.metrics`).

As a web application: loopback by default; with a password every request needs HTTP basic
authentication (any user name; the scheme's case does not matter), and a client that keeps
failing waits (``429``, doubling from 1 s after 3 failures, up to a minute). Every answer carries a
Content-Security-Policy allowing only this origin's own script and style (no inline code), and
forbids framing and content sniffing. At most ``max_streams`` event streams are open at once.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

StatusSource = Callable[[], "dict[str, Any] | None"]

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src "
        "'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
#: The page's files: URL path → (file in this package, content type).
ASSETS = {
    "/": ("page.html", "text/html"),
    "/page.js": ("page.js", "text/javascript"),
    "/page.css": ("page.css", "text/css"),
    "/favicon.svg": ("favicon.svg", "image/svg+xml"),
    "/favicon.ico": ("favicon.svg", "image/svg+xml"),  # browsers ask for it whatever the page says
}
FREE_FAILURES = 3  # wrong passwords before a client has to wait
MAX_WAIT = 60.0


class AuthBackoff:
    """Per client address: after ``FREE_FAILURES`` wrong passwords, each further one doubles the
    wait (1, 2, 4 … 60 s) before that address may try again; a right password clears it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.failures: dict[str, int] = {}
        self.until: dict[str, float] = {}

    def wait_left(self, client: str) -> float:
        return max(0.0, self.until.get(client, 0.0) - self.clock())

    def failed(self, client: str) -> None:
        n = self.failures[client] = self.failures.get(client, 0) + 1
        if n > FREE_FAILURES:
            self.until[client] = self.clock() + min(MAX_WAIT, 2.0 ** (n - FREE_FAILURES - 1))
        if len(self.failures) > 10_000:  # bounded memory under a scan from many addresses
            self.failures.clear()
            self.until.clear()

    def succeeded(self, client: str) -> None:
        self.failures.pop(client, None)
        self.until.pop(client, None)


def given_password(header: str) -> str | None:
    """The password of a basic Authorization header (any user name), or None."""
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        return base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")[2]
    except (ValueError, UnicodeDecodeError):
        return None


def reference_from_run(run_dir: Path, *, local_only: bool = False) -> dict[str, Any] | None:
    """What a dashboard draws as its reference, from a run's ``summary.json``: the Local run
    recorded with it (``--compare-local``), else (unless ``local_only``) that run's own final
    accuracy, labelled with its name. None when there is no summary."""
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    local = summary.get("local_reference")
    if isinstance(local, dict) and isinstance(local.get("mean_accuracy"), (int, float)):
        return {
            "label": "Local",
            "mean_accuracy": local["mean_accuracy"],
            "tier_accuracy": local.get("tier_accuracy", {}),
        }
    if local_only or not isinstance(summary.get("mean_accuracy"), (int, float)):
        return None
    return {
        "label": f"run {Path(run_dir).resolve().name}",
        "mean_accuracy": summary["mean_accuracy"],
        "tier_accuracy": summary.get("tier_accuracy", {}),
    }


def build_app(
    source: StatusSource,
    *,
    password: str | None = None,
    poll: float = 0.25,
    max_streams: int = 8,
    reference: dict[str, Any] | None = None,
    backoff: AuthBackoff | None = None,
):
    from aiohttp import web

    files = {
        path: (resources.files(__package__).joinpath(name).read_bytes(), kind)
        for path, (name, kind) in ASSETS.items()
    }
    backoff = backoff or AuthBackoff()
    streams = {"open": 0}

    def current() -> dict[str, Any] | None:
        data = source()
        if data is not None and reference is not None:
            data = {**data, "reference": reference}
        return data

    @web.middleware
    async def secure(request, handler):
        try:
            if password is not None:
                client = request.remote or "?"
                left = backoff.wait_left(client)
                if left > 0:
                    raise web.HTTPTooManyRequests(text="too many wrong passwords; try again later",
                                                  headers={"Retry-After": str(int(left) + 1)})
                given = given_password(request.headers.get("Authorization", ""))
                if given is None or not hmac.compare_digest(given.encode(), password.encode()):
                    if given is not None:
                        backoff.failed(client)
                    raise web.HTTPUnauthorized(
                        text="password required",
                        headers={"WWW-Authenticate": 'Basic realm="edgefl"'},
                    )
                backoff.succeeded(client)
            response = await handler(request)
        except web.HTTPException as e:
            response = e
        if not response.prepared:  # an event stream sent its headers already (with these)
            for key, value in SECURITY_HEADERS.items():
                response.headers.setdefault(key, value)
        if isinstance(response, web.HTTPException):
            raise response
        return response

    async def asset(request):
        body, kind = files[request.path]
        return web.Response(body=body, content_type=kind)

    async def status(request):
        return web.json_response(current() or {})

    async def metrics(request):
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        from edgefl.report.metrics import status_registry

        return web.Response(
            body=generate_latest(status_registry(current)),
            headers={"Content-Type": CONTENT_TYPE_LATEST},
        )

    async def events(request):
        if streams["open"] >= max_streams:
            raise web.HTTPServiceUnavailable(
                text=f"{max_streams} event streams are open already", headers={"Retry-After": "10"}
            )
        streams["open"] += 1
        try:
            resp = web.StreamResponse(
                headers={
                    "Content-Type": "text/event-stream",
                    "X-Accel-Buffering": "no",
                    **SECURITY_HEADERS,
                }
            )
            await resp.prepare(request)
            last, idle = None, 0.0
            while True:
                data = current()
                text = json.dumps(data, sort_keys=True) if data is not None else None
                if text is not None and text != last:
                    await resp.write(f"data: {text}\n\n".encode())
                    last, idle = text, 0.0
                elif idle > 15:  # a comment keeps proxies and the browser from timing out
                    await resp.write(b": keep-alive\n\n")
                    idle = 0.0
                await asyncio.sleep(poll)
                idle += poll
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            streams["open"] -= 1
        return resp

    app = web.Application(middlewares=[secure])
    for path in files:
        app.router.add_get(path, asset)
    app.router.add_get("/status", status)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/events", events)
    return app


def run_dashboard(
    source: StatusSource,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    password: str | None = None,
    reference: dict[str, Any] | None = None,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve until interrupted."""
    from aiohttp import web

    async def main():
        runner = web.AppRunner(build_app(source, password=password, reference=reference))
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1] if runner.addresses else port
        if on_ready:
            on_ready(f"http://{host}:{bound}/")
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
