"""The dashboard as a web application, over real HTTP on loopback: security headers, basic
authentication (any case of the scheme) with a back-off, a cap on event streams, the page's own
files, and the Prometheus metrics of the dashboard and of the server, scraped and parsed."""

import asyncio
import base64
import json
import urllib.request

import pytest

pytest.importorskip("aiohttp")
from aiohttp import ClientSession, ClientTimeout  # noqa: E402
from aiohttp.test_utils import TestServer  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from edgefl.dashboard import (  # noqa: E402
    SECURITY_HEADERS,
    AuthBackoff,
    build_app,
    reference_from_run,
)
from edgefl.report.metrics import serve_metrics  # noqa: E402
from edgefl.runtime.status import FleetStatus  # noqa: E402
from edgefl.transport.base import Delivery  # noqa: E402
from edgefl.transport.broker import free_port  # noqa: E402


def snapshot(phase="train"):
    """A fleet status as the server writes it: two tiers, one device gone, one refused reply."""
    s = FleetStatus("lab", run_name="r", algorithm="fedavg", rounds=4, deadline=10.0)
    for d, tier in (("pi-01", "2"), ("pi-02", "2"), ("jetson-01", "4")):
        s.registered(d, tier, f"cnn-{tier}", {"name": "pi", "cores": 4})
    s.exchange_started("train", 1, ["pi-01", "pi-02", "jetson-01"], timeout=10.0)
    s.exchange_done(
        "train",
        1,
        {
            "pi-01": Delivery("pi-01", b"x" * 1000),
            "jetson-01": Delivery("jetson-01", b"y" * 3000, rejected=("bad nonce",)),
            "pi-02": Delivery("pi-02", None, "deadline"),
        },
        {"pi-01": 500, "pi-02": 500, "jetson-01": 700},
    )
    s.connection = lambda d: "offline" if d == "pi-02" else "online"
    s.gone_after = 0.0
    s.round_recorded(
        {
            "round": 1,
            "completed": ["pi-01", "jetson-01"],
            "failed": {"pi-02": "deadline"},
            "bytes_up_total": 4000,
            "bytes_down_total": 1700,
            "eval": {"mean_accuracy": 0.6, "tier_accuracy": {"2": 0.5, "4": 0.7}},
        }
    )
    snap = s.snapshot()
    snap["server"]["phase"] = phase
    return snap


def metrics_of(text):
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def auth(password, scheme="Basic", user="ops"):
    return {
        "Authorization": f"{scheme} " + base64.b64encode(f"{user}:{password}".encode()).decode()
    }


async def serve(app, check):
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with ClientSession(timeout=ClientTimeout(total=30)) as http:
            await check(http, str(server.make_url("/")).rstrip("/"))
    finally:
        await server.close()


def test_every_answer_carries_the_security_headers_and_the_page_has_its_own_files():
    async def check(http, base):
        for path, kind in (
            ("/", "text/html"),
            ("/page.js", "text/javascript"),
            ("/page.css", "text/css"),
            ("/favicon.ico", "image/svg+xml"),
            ("/status", "application/json"),
            ("/nope", None),
        ):
            async with http.get(base + path) as r:
                assert r.status == (404 if path == "/nope" else 200), path
                if kind:
                    assert r.content_type == kind, path
                for key, value in SECURITY_HEADERS.items():
                    assert r.headers.get(key) == value, (path, key)
        async with http.get(base + "/") as r:
            page = await r.text()
        assert "<script>" not in page and "<style>" not in page  # the policy allows no inline code
        async with http.get(base + "/status") as r:
            assert (await r.json())["devices"]["pi-02"]["state"] == "gone"

    asyncio.run(serve(build_app(lambda: snapshot()), check))


def test_basic_authentication_any_scheme_case_and_a_back_off_after_repeated_failures():
    now = [1000.0]
    backoff = AuthBackoff(clock=lambda: now[0])

    async def check(http, base):
        async with http.get(base + "/status") as r:
            assert r.status == 401 and r.headers["WWW-Authenticate"].startswith("Basic")
            assert r.headers["X-Frame-Options"] == "DENY"
        for scheme in ("Basic", "basic", "BASIC"):
            async with http.get(base + "/status", headers=auth("s3cret", scheme)) as r:
                assert r.status == 200, scheme
        for _ in range(3):  # free failures
            async with http.get(base + "/status", headers=auth("wrong")) as r:
                assert r.status == 401
        # the 4th: from now on, wait
        async with http.get(base + "/status", headers=auth("wrong")) as r:
            assert r.status == 401
        # even the right one waits
        async with http.get(base + "/status", headers=auth("s3cret")) as r:
            assert r.status == 429 and int(r.headers["Retry-After"]) >= 1
        now[0] += 1.5
        async with http.get(base + "/status", headers=auth("wrong")) as r:  # the 5th: 2 s now
            assert r.status == 401
        now[0] += 1.5
        async with http.get(base + "/status", headers=auth("s3cret")) as r:
            assert r.status == 429
        now[0] += 1.0
        # waited: in, and cleared
        async with http.get(base + "/status", headers=auth("s3cret")) as r:
            assert r.status == 200
        assert backoff.failures == {}

    asyncio.run(serve(build_app(lambda: snapshot(), password="s3cret", backoff=backoff), check))


def test_event_streams_are_capped():
    async def check(http, base):
        streams = []
        try:
            for _ in range(2):
                r = await http.get(base + "/events")
                assert (
                    r.status == 200
                    and r.headers["Content-Security-Policy"]
                    == SECURITY_HEADERS["Content-Security-Policy"]
                )
                first = await r.content.readline()
                assert first.startswith(b"data: ") and json.loads(first[6:])["fleet"] == "lab"
                streams.append(r)
            async with http.get(base + "/events") as r:
                assert r.status == 503 and r.headers["Retry-After"]
            streams.pop().close()  # one closes: a new one may open
            for _ in range(100):
                r = await http.get(base + "/events")
                if r.status == 200:
                    streams.append(r)
                    break
                r.close()
                await asyncio.sleep(0.05)
            assert streams[-1].status == 200
        finally:
            for r in streams:
                r.close()

    asyncio.run(serve(build_app(lambda: snapshot(), max_streams=2, poll=0.05), check))


def test_the_dashboard_metrics_scrape_as_prometheus_text():
    async def check(http, base):
        async with http.get(base + "/metrics") as r:
            assert r.status == 200 and r.content_type == "text/plain"
            return metrics_of(await r.text())

    got = {}

    async def keep(http, base):
        got.update(await check(http, base))

    asyncio.run(serve(build_app(lambda: snapshot("evaluate")), keep))
    assert got[("edgefl_devices", (("state", "gone"),))] == 1
    assert got[("edgefl_devices", (("state", "idle"),))] == 2
    assert got[("edgefl_devices", (("state", "training"),))] == 0
    assert (
        got[("edgefl_run_phase", (("phase", "evaluate"),))] == 1
        and got[("edgefl_run_phase", (("phase", "train"),))] == 0
    )
    assert got[("edgefl_round", ())] == 1 and got[("edgefl_rounds", ())] == 4
    assert (
        got[("edgefl_accuracy", (("tier", "2"),))] == 0.5
        and got[("edgefl_accuracy", (("tier", "4"),))] == 0.7
    )
    assert got[("edgefl_mean_accuracy", ())] == 0.6
    assert got[("edgefl_bytes_total", (("direction", "up"),))] == 4000
    assert got[("edgefl_bytes_total", (("direction", "down"),))] == 1700
    assert got[("edgefl_refused_messages_total", ())] == 1


def test_the_server_metrics_endpoint_follows_its_fleet_status():
    # Prepare: a live FleetStatus served the way `server start --metrics-port` serves it
    s = FleetStatus("lab", run_name="r", algorithm="fedavg", rounds=3, deadline=10.0)
    port = free_port()
    httpd, _ = serve_metrics(s.snapshot, port)
    try:
        def scrape():
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                return metrics_of(r.read().decode())

        before = scrape()
        s.registered("pi-01", "2", "cnn-2", {})
        s.exchange_started("train", 1, ["pi-01"], timeout=10.0)
        during = scrape()
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert (
        before[("edgefl_devices", (("state", "idle"),))] == 0
        and before[("edgefl_run_phase", (("phase", "waiting"),))] == 1
    )
    assert (
        during[("edgefl_devices", (("state", "training"),))] == 1
        and during[("edgefl_run_phase", (("phase", "train"),))] == 1
    )


def test_the_reference_is_local_when_recorded_else_the_run_itself(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "summary.json").write_text(
        json.dumps(
            {
                "mean_accuracy": 0.7,
                "tier_accuracy": {"2": 0.7},
                "local_reference": {"mean_accuracy": 0.55, "tier_accuracy": {"2": 0.55}},
            }
        )
    )
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "summary.json").write_text(
        json.dumps({"mean_accuracy": 0.66, "tier_accuracy": {}})
    )
    assert reference_from_run(tmp_path / "a") == {
        "label": "Local",
        "mean_accuracy": 0.55,
        "tier_accuracy": {"2": 0.55},
    }
    assert reference_from_run(tmp_path / "b")["label"] == "run b"
    assert reference_from_run(tmp_path / "b", local_only=True) is None
    assert reference_from_run(tmp_path / "missing") is None


def test_the_grafana_dashboard_queries_only_metrics_that_exist():
    # Prepare: every sample name the collector exposes for a finished run
    import re
    from pathlib import Path

    from edgefl.report.metrics import StatusCollector

    snap = snapshot("finished")
    snap["server"]["result"] = {"mean_accuracy": 0.6, "devices": 2}
    snap["server"]["registered"], snap["server"]["expected"] = 3, 3
    exposed = {
        sample.name
        for family in StatusCollector(lambda: snap).collect()
        for sample in family.samples
    }
    # Execute: the names the example dashboard queries
    board = json.loads(
        (Path(__file__).resolve().parent.parent / "deploy" / "grafana-dashboard.json").read_text()
    )
    queried = {
        name
        for panel in board["panels"]
        for t in panel["targets"]
        for name in re.findall(r"edgefl_[a-z_]+", t["expr"])
    }
    # Assert
    assert queried and queried <= exposed, queried - exposed
    assert {
        "edgefl_devices",
        "edgefl_accuracy",
        "edgefl_bytes_total",
        "edgefl_refused_messages_total",
        "edgefl_round",
    } <= queried


def test_bytes_plot_explains_alternating_rounds_and_marks_cvae_rounds():
    # Prepare: Velo's rounds as the demo records them: evaluated every second round, the CVAE
    # trained in the others, the next training downlink not re-sent after an evaluation
    import matplotlib.pyplot as plt

    from edgefl.report.plots import _explain_alternation

    rounds = [
        {"round": r, "eval": {"mean_accuracy": 0.5}}
        if r % 2 == 0
        else {
            "round": r,
            "server": {"cvae_loss": 0.1},
            "downlinks_not_resent": ["d00"] if r > 1 else [],
        }
        for r in range(1, 7)
    ]
    fig, ax = plt.subplots()
    try:
        # Execute
        noted = _explain_alternation(ax, fig, rounds, [r["round"] for r in rounds])
        labels = ax.get_legend_handles_labels()[1]
        notes = [t.get_text() for t in fig.texts]
    finally:
        plt.close(fig)
    # Assert
    assert (
        noted
        and "evaluation round" in labels
        and "CVAE round (the server trained its CVAE)" in labels
    )
    assert any("not re-sent" in n for n in notes)
    # a run evaluated every round alternates nothing: no band, no note
    fig, ax = plt.subplots()
    try:
        assert not _explain_alternation(ax, fig, [{"round": r, "eval": {}} for r in (1, 2)], [1, 2])
        assert ax.get_legend_handles_labels()[1] == []
    finally:
        plt.close(fig)
