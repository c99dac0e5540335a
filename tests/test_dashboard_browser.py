"""The dashboard in a real headless browser (Debian's chromium driven by Playwright) over a real
fleet (Mosquitto, `edgefl server start`, three `edgefl train` devices, `edgefl dashboard`): the
run's states as an operator sees them (waiting, training, a device gone, finished), each
screenshotted; the server's /metrics scraped at the same moments; no script or policy error in
the page. ``EDGEFL_UPDATE_SCREENSHOTS=1`` copies the screenshots to docs/img/ (the README shows
one).

The browser part FAILS (never skips) when chromium or Playwright is missing: CI installs both.
"""

import json
import os
import shutil
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from edgefl.runtime.fleet import SIMULATED_PROFILE, data_spec_for, device_command, start_device
from edgefl.transport.broker import MosquittoBroker, free_port
from tests.commands import (
    dashboard,
    dashboard_page,
    dashboard_url,
    kill,
    server_start,
    stop,
    tiny_run,
)
from tests.conftest import scaled, tiny_config
from tests.needs import need_mosquitto, need_playwright
from tests.test_fleet_live import launch_browser, page_wait

pytestmark = pytest.mark.slow
FLEET = "shots"
DOCS = Path(__file__).resolve().parent.parent / "docs" / "img"


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_the_dashboard_shows_a_run_from_waiting_to_finished(tmp_path):
    need_mosquitto()
    sync_playwright = need_playwright()

    # Prepare: a broker, a server for 3 devices, the dashboard; devices start later, one by one
    broker = MosquittoBroker(port=0).start()
    url = f"mqtt://127.0.0.1:{broker.port}"
    metrics_port = free_port()
    cfg = tiny_config(tmp_path, clients=3)
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(SIMULATED_PROFILE))
    server = subprocess.Popen(
        server_start(
            url, FLEET,
            # Velo (its CVAE every second round) on two tiers, evaluated every second round: all the
            # charts have to say
            "--algorithm", "velo", "--option", "cvae_interval=2", "--model", "cnn",
            "--tiers", "2,4", "--feature-dim", "64", "--eval-every", "2",
            # rounds enough that the run outlasts the grace after d02 is killed: a dropped device
            # no longer holds its round, and the metrics are read while the server runs
            "--rounds", "10", "--min-devices", "3", "--fraction", "1",
            "--deadline", str(scaled(20)), "--gone-after", str(scaled(2)),
            *tiny_run(tmp_path / "runs", "shots", steps=10), "--metrics-port", str(metrics_port),
        ),
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "server.log", "wb"),  # noqa: SIM115
    )
    dash = dashboard("--broker", url, "--fleet", FLEET)
    devices = {}

    def start(device_id, i):
        devices[device_id] = start_device(
            device_command(
                url,
                FLEET,
                device_id,
                data_spec_for(cfg, i),
                tier="24"[i % 2],
                profile_file=profile,
                delay=2.0,
            ),
            tmp_path / f"{device_id}.log",
        )

    shots, problems, metrics = {}, [], {}
    # until a device is killed, none of these may exit (the page would wait for what cannot come)
    running = {"the server": (server, tmp_path / "server.log"), "the dashboard": (dash, None)}
    try:
        page_url = dashboard_url(dash)
        with sync_playwright() as p:
            browser = launch_browser(p)
            try:
                page = dashboard_page(browser, viewport={"width": 1280, "height": 860})
                page.on(
                    "console",
                    lambda m: problems.append(m.text) if m.type in ("error", "warning") else None,
                )
                page.on("pageerror", lambda e: problems.append(str(e)))
                page.goto(page_url)

                def shot(name):
                    shots[name] = tmp_path / f"dashboard-{name}.png"
                    page.screenshot(path=str(shots[name]), full_page=True)

                # Execute and Assert: waiting for devices, one registered
                start("d00", 0)
                page_wait(lambda ms: page.wait_for_selector(
                    "#run[data-phase=waiting] >> text=/Waiting for devices: 1/", timeout=ms),
                    "waiting for devices: 1", running, 240)
                page.wait_for_selector("tr[data-device=d00]")
                shot("waiting")
                # training, with a round on the charts
                start("d01", 1)
                start("d02", 2)
                page_wait(lambda ms: page.wait_for_selector("#run[data-phase=train]", timeout=ms),
                          "training", running, 240)
                page_wait(lambda ms: page.wait_for_function(
                    "() => document.querySelectorAll('#bytes polyline').length >= 2",
                    timeout=ms), "a round on the bytes chart", running, 120)
                assert page.locator("tr[data-device]").count() == 3
                assert "Training round" in page.text_content("#state")
                page_wait(lambda ms: page.wait_for_selector(  # tiers named as tiers
                    "#accuracy-legend >> text=tier 4", timeout=ms),
                    "tier 4 in the legend", running, 120)
                assert page.locator("#accuracy text.axis-label").all_text_contents() == [
                    "round",
                    "accuracy (%)",
                ]
                assert page.locator("#bytes text.axis-label").all_text_contents() == [
                    "round",
                    "MB per round (10⁶ bytes)",
                ]
                page.wait_for_selector("#bytes-legend >> text=CVAE round")
                shot("training")
                metrics["training"] = scrape(metrics_port)
                # a device killed: late, then gone
                devices["d02"].send_signal(signal.SIGKILL)
                del running["the server"]  # it may finish its rounds now (its status says gone)
                page_wait(lambda ms: page.wait_for_selector(
                    "tr[data-device=d02][data-state=gone]", timeout=ms), "d02 gone", running, 120)
                shot("gone")
                metrics["gone"] = scrape(metrics_port)
                # finished, with the result and the final evaluation on the chart
                page.wait_for_selector("#run[data-phase=finished]", timeout=scaled(300) * 1000)
                page.wait_for_selector("#result >> text=/Result: [0-9.]+ % mean accuracy/")
                assert page.locator("#accuracy path.final").count() >= 1
                # killed: lost, not left
                assert page.get_attribute("tr[data-device=d02]", "data-state") == "gone"
                shot("finished")
            finally:
                browser.close()
        assert server.wait(scaled(120)) == 0, (tmp_path / "server.log").read_text()[-3000:]
    finally:
        stop(dash, server)
        kill(*devices.values())
        broker.stop()
    assert problems == []  # no CSP violation, no script error
    assert (
        metrics["training"][("edgefl_devices", (("state", "training"),))]
        + metrics["training"][("edgefl_devices", (("state", "idle"),))]
        == 3
    )
    assert metrics["gone"][("edgefl_devices", (("state", "gone"),))] == 1
    assert metrics["gone"][("edgefl_bytes_total", (("direction", "up"),))] > 0
    if os.environ.get("EDGEFL_UPDATE_SCREENSHOTS"):
        DOCS.mkdir(parents=True, exist_ok=True)
        for path in shots.values():
            shutil.copy(path, DOCS / path.name)
    assert sorted(shots) == ["finished", "gone", "training", "waiting"]
