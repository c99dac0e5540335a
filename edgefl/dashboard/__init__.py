"""``edgefl dashboard``: a live web page of a fleet (aiohttp; server-sent events; no assets from
the internet, so it works offline).

    run_dashboard(source, host="127.0.0.1", port=8080, password=None)

``source`` is a callable returning the latest fleet status (a :class:`~edgefl.runtime.status.StatusFeed`
over the broker, or a run directory's ``status.json``). The page (``page.html``, one file with
its script) opens ``/events`` and redraws on every status: devices and their liveness, the round
in progress, accuracy per tier per round, bytes per round. Loopback by default; with a password,
every request needs HTTP basic authentication (any user name).
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
from collections.abc import Callable
from importlib import resources
from typing import Any

log = logging.getLogger(__name__)

StatusSource = Callable[[], "dict[str, Any] | None"]


def build_app(source: StatusSource, *, password: str | None = None, poll: float = 0.25):
    from aiohttp import web

    page = resources.files(__package__).joinpath("page.html").read_text()

    @web.middleware
    async def require_password(request, handler):
        if password is not None:
            header = request.headers.get("Authorization", "")
            given = ""
            if header.startswith("Basic "):
                try:
                    given = base64.b64decode(header[6:]).decode("utf-8").partition(":")[2]
                except (ValueError, UnicodeDecodeError):
                    given = ""
            if not hmac.compare_digest(given.encode(), password.encode()):
                return web.Response(status=401, headers={"WWW-Authenticate": 'Basic realm="edgefl"'}, text="password required")
        return await handler(request)

    async def index(request):
        return web.Response(text=page, content_type="text/html", headers={"Cache-Control": "no-store"})

    async def status(request):
        return web.json_response(source() or {})

    async def events(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store", "X-Accel-Buffering": "no"})
        await resp.prepare(request)
        last, idle = None, 0.0
        try:
            while True:
                data = source()
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
        return resp

    app = web.Application(middlewares=[require_password])
    app.router.add_get("/", index)
    app.router.add_get("/status", status)
    app.router.add_get("/events", events)
    return app


def run_dashboard(source: StatusSource, *, host: str = "127.0.0.1", port: int = 8080, password: str | None = None,
                  on_ready: Callable[[str], None] | None = None) -> None:
    """Serve until interrupted."""
    from aiohttp import web

    async def main():
        runner = web.AppRunner(build_app(source, password=password))
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
