"""What the commands tell an operator while they work: plain, whole lines through a pipe; progress
bars on a terminal that leave ``--json`` alone; ``server start`` naming the devices that
registered."""

import io
import json
import os
import pty
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from rich.console import Console

from edgefl.report.console import Feedback, make_console
from tests.commands import flags
from tests.needs import need_mosquitto

#: A short real run: every line it prints is longer than 80 columns once the run name is long.
RUN = ["simulate", *flags(dataset="synthetic", clients=3, rounds=2, train_samples=600,
                          test_samples=200, eval_samples=100, steps=3, batch_size=16, width=0.25)]


def edgefl(*args):
    return [sys.executable, "-m", "edgefl.cli.main", *args]


def test_piped_output_keeps_every_line_whole(tmp_path):
    # Prepare: a run directory whose path alone is wider than a default 80-column console
    name = "a-run-name-long-enough-that-its-path-does-not-fit-in-eighty-columns-" + "x" * 30
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    # Execute: stderr is a pipe
    done = subprocess.run(
        edgefl(*RUN, "--out", str(tmp_path), "--run-name", name),
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    # Assert: one line per round, the results line whole, no escape codes
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    rounds = [line for line in lines if line.startswith("round")]
    assert len(rounds) == 2, lines
    for line in rounds:
        assert re.fullmatch(
            r"round +\d+/2 +devices 3/3 .*up +[\d.]+ MB +down +[\d.]+ MB +[\d.]+ s", line
        ), line
    assert f"results: {tmp_path / name}" in lines
    assert "final evaluation: 3 devices" in lines  # the final evaluation is announced, not silent
    assert "\x1b[" not in done.stderr
    assert max(len(line) for line in lines) > 80  # the test would have caught a wrap


class Terminal:
    """A pseudo-terminal whose output is collected by a thread (a full pty would block the
    writer)."""

    def __init__(self):
        self.master, self.slave = pty.openpty()
        self.shown = bytearray()
        self.reader = threading.Thread(target=self._drain, daemon=True)
        self.reader.start()

    def _drain(self):
        while True:
            try:
                chunk = os.read(self.master, 4096)
            except OSError:
                return
            if not chunk:
                return
            self.shown.extend(chunk)

    def close(self):
        self.reader.join(10)
        os.close(self.master)

    def text(self):
        return self.shown.decode(errors="replace")


def test_progress_bars_on_a_terminal_leave_the_json_on_stdout_alone(tmp_path):
    # Prepare: stderr is a terminal (a pty), stdout a pipe
    term = Terminal()
    slave, shown = term.slave, term.shown
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm"}
    # Execute
    proc = subprocess.Popen(
        edgefl(*RUN, "--out", str(tmp_path), "--run-name", "tty", "--json"),
        stdout=subprocess.PIPE,
        stderr=slave,
        env=env,
    )
    os.close(slave)
    out, _ = proc.communicate(timeout=300)
    term.close()
    # Assert: stdout is one JSON document; the terminal got bars (rich's bar glyphs and counts)
    assert proc.returncode == 0, shown.decode(errors="replace")[-2000:]
    summary = json.loads(out)
    assert summary["rounds"] == 2 and 0.0 <= summary["mean_accuracy"] <= 1.0
    text = shown.decode(errors="replace")
    assert "━" in text and "round 1: training" in text and "final evaluation" in text
    assert "rounds" in text and "/2" in text


def test_plain_feedback_names_the_registered_devices_every_few_seconds_and_at_the_end():
    # Prepare: a console that is not a terminal
    buf = io.StringIO()
    console = Console(file=buf, width=40, soft_wrap=True)
    # Execute
    now = [0.0]
    with Feedback(console, rounds=3) as fb:
        fb.clock = lambda: now[0]
        fb.progress_hook("register", None, 0, 6)
        # within 5 s of the last line: none
        fb.progress_hook("register", None, 1, 6, names=["pi-02"])
        now[0] = 6.0
        fb.progress_hook("register", None, 2, 6, names=["pi-02", "pi-01"])
        now[0] = 12.0
        fb.progress_hook("register", None, 2, 6, names=["pi-01", "pi-02"])  # nothing new: no line
        now[0] = 12.5
        fb.progress_hook(
            "register", None, 6, 6, names=["pi-01", "pi-02", "pi-03", "pi-04", "pi-05", "pi-06"]
        )  # the last: at once
        fb.progress_hook("train", 1, 0, 6)  # per-exchange progress is for terminals only
        fb.progress_hook("train", 1, 3, 6)
        fb.round_done("round 1 done, a line much longer than the forty columns of this console")
        fb.progress_hook("final", None, 0, 6)
        fb.progress_hook("final", None, 6, 6)
    # Assert
    assert buf.getvalue().splitlines() == [
        "waiting for devices: 0 of 6 registered",
        "waiting for devices: 2 of 6 registered: pi-01, pi-02",
        "waiting for devices: 6 of 6 registered: pi-01, pi-02, pi-03, pi-04, pi-05, pi-06",
        "round 1 done, a line much longer than the forty columns of this console",
        "final evaluation: 6 devices",
    ]


def test_quiet_feedback_prints_only_what_is_asked_always():
    buf = io.StringIO()
    with Feedback(Console(file=buf), quiet=True) as fb:
        fb.progress_hook("register", None, 1, 2, names=["a"])
        fb.round_done("round 1")
        fb.line("the result", always=True)
    assert buf.getvalue() == "the result\n"


def test_a_console_that_is_not_a_terminal_never_wraps(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    console = make_console(stderr=True)  # pytest captures stderr: not a terminal
    assert not console.is_terminal and console.soft_wrap and console.width >= 200


@pytest.fixture
def broker_url():
    """A Mosquitto broker of the test's own (stopped after it): its URL."""
    from edgefl.transport.broker import MosquittoBroker

    need_mosquitto()
    broker = MosquittoBroker(port=0).start()
    yield f"mqtt://127.0.0.1:{broker.port}"
    broker.stop()


def tiny_server(url: str, fleet: str, run: Path, *flags: str, **streams) -> subprocess.Popen:
    """``edgefl server start`` of ``fleet``: a tiny synthetic run (2 steps a round) into ``run``,
    with ``flags``; its output streams as ``streams`` say, as text."""
    from tests.commands import server_start, tiny_run

    command = server_start(url, fleet, *flags, *tiny_run(run.parent, run.name, steps=2))
    return subprocess.Popen(command, text=True, **streams)


@pytest.mark.slow
def test_server_start_says_which_devices_registered_while_it_waits(tmp_path, broker_url):
    from edgefl.runtime.fleet import SIMULATED_PROFILE, data_spec_for, device_command, start_device
    from tests.conftest import tiny_config

    # Prepare: a broker, a server waiting for 2 devices, and one device
    url = broker_url
    server = tiny_server(url, "fb", tmp_path / "runs" / "wait", "--rounds", "1",
                         "--min-devices", "2", stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
    cfg = tiny_config(tmp_path, clients=2)
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(SIMULATED_PROFILE))
    device = start_device(
        device_command(url, "fb", "pi-01", data_spec_for(cfg, 0), profile_file=profile),
        tmp_path / "pi-01.log",
    )
    lines = []
    try:
        # Execute: read the server's lines until it names the device (or ends)
        for line in server.stderr:
            lines.append(line.rstrip("\n"))
            if "pi-01" in line:
                break
    finally:
        device.terminate()
        server.terminate()
        server.wait(30)
        device.wait(30)
    # Assert: before any device, then with the device's name
    waiting = [line for line in lines if line.startswith("waiting for devices")]
    assert waiting[0] == "waiting for devices: 0 of 2 registered", lines
    assert waiting[-1] == "waiting for devices: 1 of 2 registered: pi-01", lines


@pytest.mark.slow
def test_train_on_a_terminal_draws_a_bar_of_the_rounds(tmp_path, broker_url):
    from edgefl.runtime.fleet import SIMULATED_PROFILE, data_spec_for
    from tests.conftest import tiny_config

    # Prepare: a broker and a 2-round server for one device; the device's stdout is a terminal
    url = broker_url
    server = tiny_server(url, "tty", tmp_path / "runs" / "tty", "--rounds", "2",
                         "--min-devices", "1", "--json",
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(SIMULATED_PROFILE))
    term = Terminal()
    try:
        # Execute
        data = data_spec_for(tiny_config(tmp_path, clients=1), 0).to_string()
        device = subprocess.Popen(
            edgefl("train", "--broker", url, "--fleet", "tty", "--device-id", "pi-01",
                   "--profile", str(profile), "--data", data),
            stdout=term.slave,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "COLUMNS": "120", "TERM": "xterm"},
        )
        os.close(term.slave)
        assert device.wait(300) == 0
        summary = json.loads(server.communicate(timeout=120)[0])
    finally:
        for proc in (server,):
            if proc.poll() is None:
                proc.terminate()
                proc.wait(20)
        term.close()
    # Assert: the device's lines, and a bar of the rounds it trained (rich's glyphs and its count)
    text = term.text()
    assert summary["rounds"] == 2
    assert (
        "[pi-01] registered with server" in text
        and "[pi-01] round" in text
        and "[pi-01] done" in text
    )
    assert "rounds trained" in text and "━" in text and "/2" in text


def test_a_fleet_started_through_python_m_prints_no_runpy_warning(tmp_path):
    # `python -m edgefl.cli.main simulate --transport mqtt` (how the CUDA check and these tests
    # start it): each forked device first re-ran that module as __mp_main__, which the fork server
    # had imported, and runpy's RuntimeWarning went to the console once per device
    done = subprocess.run(
        edgefl(*RUN, "--transport", "mqtt", "--out", str(tmp_path), "--run-name", "m"),
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "final evaluation: 3 of 3 devices answered" in done.stderr
    assert "RuntimeWarning" not in done.stderr, done.stderr
