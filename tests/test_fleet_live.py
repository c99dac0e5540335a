"""A live 3-device fleet over Mosquitto (fleet-scoped ACL): `edgefl fleet status` and the web
dashboard in a real headless browser (Debian's chromium driven by Playwright) show the devices,
the round advancing, and a killed device turning late, then gone.

The browser part FAILS (never skips) when chromium or Playwright is missing: CI installs both.
"""

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from edgefl.models import family_tiers
from edgefl.transport.accounts import add_user
from edgefl.transport.broker import MosquittoBroker
from tests.commands import (
    dashboard,
    dashboard_page,
    dashboard_url,
    fleet_devices,
    kill,
    run_ok,
    server_start,
    stop,
    tiny_run,
)
from tests.conftest import scaled, tiny_config
from tests.needs import need_mosquitto, need_playwright

pytestmark = pytest.mark.slow
FLEET = "live"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def cli(*args, timeout=60):
    return run_ok(*args, timeout=timeout).stdout


def launch_browser(playwright):
    """Chromium from Debian, or a failure that says why (the test must not pass without it)."""
    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium; .ci/run "
            "does)"
        )
    try:
        return playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
    except Exception as e:  # noqa: BLE001 - the message is the point
        pytest.fail(f"the browser could not start: {e}")


def page_wait(wait, what: str, running: dict, timeout: float):
    """`wait(ms)` (a Playwright wait) until it succeeds, in slices of 2 s. Fails at once, with its
    log, when a process of `running` ({name: (Popen, log path or None)}) has exited (what the page
    waits for can no longer come), else after `scaled(timeout)` s (a bound for a hang only)."""
    from playwright.sync_api import TimeoutError as PageTimeout

    bound = scaled(timeout)
    end = time.monotonic() + bound
    while True:
        try:
            return wait(2000)
        except PageTimeout:
            for name, (proc, log) in running.items():
                if proc.poll() is not None:
                    tail = Path(log).read_text(errors="replace")[-3000:] if log else ""
                    pytest.fail(f"{name} exited ({proc.returncode}) while the page waited for "
                                f"{what}\n{tail}")
            if time.monotonic() > end:
                raise AssertionError(f"timed out after {bound:g} s waiting for {what}") from None


def test_fleet_status_and_dashboard_show_a_live_fleet(tmp_path):
    need_mosquitto()
    sync_playwright = need_playwright()

    # Prepare: the broker with one account per role, a server, three devices, the dashboard
    passwd, acl = tmp_path / "passwd", tmp_path / "acl"
    pw = {
        name: add_user(passwd, acl, name, fleet=FLEET, role=role)
        for name, role in [
            ("edgefl-server", "server"),
            ("ops", "operator"),
            ("ops-cli", "operator"),
            ("d00", "device"),
            ("d01", "device"),
            ("d02", "device"),
        ]
    }
    broker = MosquittoBroker(
        port=0, password_file=passwd, acl_file=acl, workdir=tmp_path / "mosq"
    ).start()

    def url(name):
        return f"mqtt://{name}:{pw[name]}@127.0.0.1:{broker.port}"

    cfg = tiny_config(tmp_path, algorithm="fedavg", clients=3)
    devices = fleet_devices(cfg, url, FLEET, tmp_path, delay=0.5, verbose=True)
    tiers = list(cfg.tiers) if cfg.tiers else family_tiers(cfg.model)
    # the server as an operator runs it; a generous deadline, a short grace for lost connections
    # (both stretched by the measured speed factor: the page must see d02 "late" before it turns
    # "gone")
    run_dir = tmp_path / "runs" / "live"
    server = subprocess.Popen(
        server_start(
            url("edgefl-server"), FLEET, "--algorithm", "fedavg", "--rounds", "500",
            "--min-devices", "3", "--fraction", "1", "--deadline", str(scaled(30)),
            "--gone-after", str(scaled(4)), *tiny_run(tmp_path / "runs", "live"),
        ),
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "server.log", "wb"),  # noqa: SIM115
    )
    dash = dashboard("--broker", url("ops"), "--fleet", FLEET)
    seen_states = []
    try:
        page_url = dashboard_url(dash)

        running = {"the server": (server, tmp_path / "server.log"), "the dashboard": (dash, None),
                   **{d: (devices[d], tmp_path / f"{d}.log") for d in ("d00", "d01")}}
        with sync_playwright() as p:
            browser = launch_browser(p)
            try:
                # a wrong password is refused; the right one shows the page
                denied = browser.new_context(
                    http_credentials={"username": "x", "password": "wrong"}
                )
                assert denied.new_page().goto(page_url).status == 401
                page = dashboard_page(browser)
                page.goto(page_url)
                # Execute and Assert: the devices appear, the round advances without a reload
                page_wait(lambda ms: page.wait_for_selector("tr[data-device=d02]", timeout=ms),
                          "d02's row", running, 240)
                page_wait(lambda ms: page.wait_for_function(
                    "() => /^[0-9]+$/.test(document.getElementById('round').textContent)",
                    timeout=ms), "a round number", running, 120)
                first_round = int(page.text_content("#round"))
                page_wait(lambda ms: page.wait_for_function(
                    f"() => +document.getElementById('round').textContent > {first_round}",
                    timeout=ms), "the next round", running, 60)
                assert page.locator("tr[data-device]").count() == 3

                status = json.loads(
                    cli("fleet", "status", "--broker", url("ops-cli"), "--fleet", FLEET, "--json")
                )
                assert sorted(status["devices"]) == ["d00", "d01", "d02"]
                for d in status["devices"].values():
                    assert (
                        d["tier"] in tiers and d["model"] and d["registered_at"] and d["last_seen"]
                    )
                    assert d["state"] in ("training", "idle", "late")
                    assert d["profile"]["name"] == "simulated"
                assert (
                    status["server"]["phase"] in ("train", "evaluate")
                    and status["server"]["rounds"] == 500
                )
                assert status["server"]["round"] >= first_round + 1
                table = cli("fleet", "status", "--broker", url("ops-cli"), "--fleet", FLEET)
                assert "d02" in table and "round" in table

                # a device killed mid-run turns late (its connection is lost), then gone
                devices["d02"].send_signal(signal.SIGKILL)
                for state in ("late", "gone"):
                    page_wait(lambda ms, state=state: page.wait_for_selector(
                        f"tr[data-device=d02][data-state={state}]", timeout=ms),
                        f"d02 {state}", running, 60)
                    seen_states.append(state)
                assert page.locator("#accuracy polyline").count() >= 1  # accuracy per tier is drawn
                rows = page.locator("tr[data-device]").count()
            finally:
                browser.close()
        # the same from the run directory (status.json, written while the server runs)
        from_run = json.loads(cli("fleet", "status", "--run", str(run_dir), "--json"))
        assert from_run["devices"]["d02"]["state"] == "gone"
        assert from_run["devices"]["d00"]["last_round"] >= first_round
        assert rows == 3
    finally:
        stop(dash, server)
        kill(*devices.values())
        broker.stop()
    assert seen_states == ["late", "gone"]
