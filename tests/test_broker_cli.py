"""``edgefl broker start``: the embedded broker serves until Ctrl-C or SIGTERM, then stops."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import paho.mqtt.client as mqtt


def test_broker_start_serves_and_stops_on_sigterm(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgefl.cli.main", "broker", "start", "--port", "0"],
        stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:
        line = ""
        while "listening on" not in line:  # waits for the event, not for a time
            line = proc.stderr.readline()
            assert line, "the broker exited before it listened"
        port = int(re.search(r"mqtt://127\.0\.0\.1:(\d+)", line).group(1))
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
        assert client.connect("127.0.0.1", port) == 0
        client.disconnect()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
