"""The fleet status read back, by ``edgefl fleet status`` and ``edgefl dashboard``: from a run
directory's ``status.json``, or from the broker (:class:`StatusFeed`: the server's retained
snapshot, written by :mod:`edgefl.runtime.status`, with the devices' reported model versions and
the server's liveness folded in by :func:`merge_active`)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgefl.runtime.status import TERMINAL

log = logging.getLogger(__name__)


def read_status_from_run(run_dir: Path) -> dict[str, Any]:
    from edgefl.errors import ConfigError

    path = Path(run_dir) / "status.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"{run_dir} holds no status.json (written by `edgefl server start` while it runs)"
        ) from None
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict) or "devices" not in data:
        raise ConfigError(f"{path} is not a fleet status")
    return data


class StatusFeed:
    """A connection that keeps the latest fleet status of ``fleet`` (with the devices' reported
    active models merged in); what ``edgefl fleet status`` and ``edgefl dashboard`` read.

    Use an operator account (``edgefl broker add-device NAME --fleet FLEET --role operator``): a
    client's id is its username on an edgefl Mosquitto, so reading with the server's own account
    would push the server off the broker.
    """

    def __init__(self, address, fleet: str):
        from edgefl.transport.mqtt import Topics

        self.address, self.topics = address, Topics(fleet)
        self.lock = threading.Lock()
        self.fleet: dict[str, Any] | None = None
        self.active: dict[str, dict[str, Any]] = {}
        self.server: Any = None
        self.refused: str | None = None
        self.updated = threading.Event()
        self.version = 0
        self.client = None

    def start(self) -> StatusFeed:
        import uuid

        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        from edgefl.errors import TransportError
        from edgefl.transport.mqtt.connection import _configure, detect_protocol

        self.client = mqtt.Client(CallbackAPIVersion.VERSION2,
                                  client_id=f"edgefl-status-{uuid.uuid4().hex[:8]}",
                                  protocol=detect_protocol(self.address))
        _configure(self.client, self.address)
        self.client.on_connect, self.client.on_message = self._on_connect, self._on_message
        self.client.reconnect_delay_set(1, 8)
        try:
            self.client.connect(self.address.host, self.address.port, keepalive=15)
        except OSError as e:
            raise TransportError(f"cannot reach the broker at {self.address}: {e}") from None
        self.client.loop_start()
        return self

    def stop(self) -> None:
        if self.client is not None:
            self.client.loop_stop()
            self.client.disconnect()

    def _on_connect(self, client, userdata, flags, reason, properties):
        if reason.is_failure:
            self.refused = str(reason)
            self.updated.set()
            return
        for t in (self.topics.fleet_status, self.topics.server_status,
                  self.topics.device("+", "active")):
            client.subscribe(t, qos=1)

    def _on_message(self, client, userdata, msg):
        try:
            value = json.loads(msg.payload) if msg.payload else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            log.warning("ignoring a non-JSON status on %s", msg.topic)
            return
        where = self.topics.parse_device(msg.topic)
        with self.lock:
            if where is not None and isinstance(value, dict):
                self.active[where[0]] = value
            elif msg.topic == self.topics.server_status:
                self.server = value
            elif msg.topic == self.topics.fleet_status and isinstance(value, dict):
                self.fleet = value
            else:
                return
            self.version += 1
        self.updated.set()

    def latest(self) -> dict[str, Any] | None:
        with self.lock:
            if self.fleet is None and not self.active:
                return None
            base = (
                json.loads(json.dumps(self.fleet))
                if self.fleet is not None
                else {"fleet": self.topics.fleet, "devices": {}, "server": {}}
            )
            return merge_active(base, self.active, self.server)


def read_status_from_broker(address, fleet: str, timeout: float = 5.0) -> dict[str, Any]:
    """The server's retained fleet status, read once."""
    from edgefl.errors import TransportError

    feed = StatusFeed(address, fleet).start()
    try:
        end = time.monotonic() + timeout
        while feed.fleet is None and feed.refused is None and time.monotonic() < end:
            feed.updated.wait(0.1)
            feed.updated.clear()
        time.sleep(0.3)  # the devices' retained reports arrive right after
    finally:
        feed.stop()
    if feed.refused is not None:
        raise TransportError(f"the broker at {address} refused the connection: {feed.refused}")
    if feed.fleet is None and not feed.active:
        raise TransportError(
            f"no fleet status for fleet {fleet!r} on {address} within {timeout:g} s (is its "
            "server running?)")
    return feed.latest()  # with no server running: the devices' model reports alone


def merge_active(status: dict[str, Any], active: Mapping[str, Mapping[str, Any]],
                 server: Any = None) -> dict[str, Any]:
    """Fold the devices' reported model versions (and the server's liveness) into a snapshot."""
    devices = status.setdefault("devices", {})
    for device_id, report in active.items():
        entry = devices.setdefault(device_id,
                                   {"state": "idle" if report.get("online", True) else "gone"})
        entry["model_version"] = report.get("version")
        entry["model_digest"] = report.get("digest")
        if report.get("error"):
            entry["model_error"] = report["error"]
    if isinstance(server, dict):
        s = status.setdefault("server", {})
        s["connection"] = server.get("state")
        same_run = (
            not s.get("epoch") or not server.get("epoch") or s.get("epoch") == server.get("epoch")
        )
        if server.get("state") == "offline" and same_run and s.get("phase") not in TERMINAL:
            # the server left mid-run (its Last Will says "stopped"), or its last status got lost
            s["phase"] = server.get("phase") if server.get("phase") in TERMINAL else "stopped"
    return status
