"""Brokers: the embedded amqtt broker (zero setup) and a Mosquitto process (production, tests).

Embedded (MQTT 3.1.1, anonymous, loopback only)::

    with EmbeddedBroker(port=0) as broker:      # port 0: a free port
        print(broker.url)                       # mqtt://127.0.0.1:PORT

It runs amqtt on its own asyncio loop in a background thread, so it can live inside the server
or the ``simulate --transport mqtt`` launcher, or alone under ``edgefl broker start``.

Mosquitto (MQTT 5) from ``broker/mosquitto.conf`` or a generated test config::

    with MosquittoBroker(port=0, password_file=..., acl_file=...) as broker: ...

The accounts Mosquitto checks (passwords, fleet-scoped ACL blocks) are made in
:mod:`edgefl.transport.accounts`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from edgefl.errors import ConfigError, TransportError

log = logging.getLogger(__name__)

#: Device ids double as MQTT usernames and topic levels: no wildcards, no separators.
DEVICE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

#: Largest MQTT packet the brokers accept (edgefl's own Limits.max_bytes is checked separately).
# MQTT's own maximum; a larger value makes paho (MQTT 5) refuse the CONNACK
MAX_PACKET_BYTES = 268_435_455


def check_device_id(device_id: str) -> str:
    if not DEVICE_ID.match(device_id or ""):
        raise ConfigError(
            f"device id {device_id!r} must be 1-64 characters of letters, digits, '_', '.', '-' "
            "(it is an MQTT username and a topic level)"
        )
    return device_id


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(host: str, port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TransportError(
                    f"no broker is listening on {host}:{port} after {timeout:.0f} s"
                ) from None
            time.sleep(0.05)


# --- embedded amqtt -----------------------------------------------------------------------------
class SnapshotDict(dict):
    """A dict whose iteration (keys, values, items) walks a snapshot, so that code which awaits
    inside the loop survives other tasks adding or removing entries meanwhile."""

    def __iter__(self):
        return iter(list(super().keys()))

    def keys(self):
        return list(super().keys())

    def values(self):
        return list(super().values())

    def items(self):
        return list(super().items())




class EmbeddedBroker:
    """amqtt in a background thread, bound to 127.0.0.1 only, anonymous (local use)."""

    def __init__(self, port: int = 1883, host: str = "127.0.0.1"):
        self.host = host
        self.port = port or free_port()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._broker = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    def start(self) -> EmbeddedBroker:
        self._thread = threading.Thread(target=self._run, name="edgefl-amqtt", daemon=True)
        self._thread.start()
        self._started.wait(30)
        if self._error is not None:
            raise TransportError(
                f"could not start the embedded broker on {self.host}:{self.port}: {self._error}"
            )
        wait_for_port(self.host, self.port)
        log.info("embedded MQTT broker listening on %s", self.url)
        return self

    def _run(self) -> None:
        from amqtt.broker import Broker

        # amqtt logs every connection at INFO; keep it to warnings unless asked.
        for name in ("amqtt", "transitions"):
            if logging.getLogger(name).level == logging.NOTSET:
                logging.getLogger(name).setLevel(logging.WARNING)
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        config = {
            "listeners": {
                "default": {
                    "type": "tcp",
                    "bind": f"{self.host}:{self.port}",
                    "max_connections": -1,
                }
            },
            "plugins": {
                "amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}
            },
        }
        try:
            self._broker = Broker(config, loop=self._loop)
            # amqtt 0.12 iterates its subscription table across awaits; a device that subscribes
            # meanwhile raised "dictionary changed size during iteration" and dropped the other's
            # session (seen with 20 devices connecting at once). Iterate over snapshots instead.
            self._broker._subscriptions = SnapshotDict(self._broker._subscriptions)
            self._loop.run_until_complete(self._broker.start())
        except BaseException as e:  # reported to start()
            self._error = e
            self._started.set()
            return
        self._started.set()
        self._loop.run_forever()
        self._loop.close()

    def stop(self) -> None:
        if self._loop is None or self._broker is None or not self._loop.is_running():
            return
        fut = asyncio.run_coroutine_threadsafe(self._broker.shutdown(), self._loop)
        try:
            fut.result(timeout=10)
        except Exception as e:  # a broker that will not stop is still stopped with its thread
            log.warning("embedded broker shutdown: %s", e)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# --- Mosquitto ----------------------------------------------------------------------------------


def mosquitto_binary() -> str | None:
    return shutil.which("mosquitto") or next(
        (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if Path(p).exists()), None
    )


class MosquittoBroker:
    """A Mosquitto process on a loopback port with a generated config (tests, demos).

    With ``password_file``/``acl_file`` anonymous access is off and a client's id is replaced by
    its username (nobody can take another client's id and push it off). ``tls`` = (CA, broker
    certificate, broker key) adds a TLS listener on ``tls_port`` that requires a client
    certificate signed by that CA and takes its common name as the username.
    ``persistence_dir`` keeps sessions and queued messages across a restart (``restart()``).
    """

    def __init__(
        self,
        port: int = 0,
        *,
        password_file: Path | None = None,
        acl_file: Path | None = None,
        persistence_dir: Path | None = None,
        workdir: Path | None = None,
        tls: tuple[Path, Path, Path] | None = None,
        tls_port: int = 0,
    ):
        binary = mosquitto_binary()
        if binary is None:
            raise TransportError(
                "mosquitto is not installed (Debian/Ubuntu: apt-get install mosquitto)"
            )
        self.binary = binary
        self.port = port or free_port()
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="edgefl-mosquitto-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.password_file, self.acl_file, self.persistence_dir = (
            password_file,
            acl_file,
            persistence_dir,
        )
        self.tls = tls
        self.tls_port = (tls_port or free_port()) if tls is not None else None
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    @property
    def tls_url(self) -> str:
        if self.tls_port is None:
            raise TransportError("this broker has no TLS listener")
        return f"mqtts://127.0.0.1:{self.tls_port}?ca={Path(self.tls[0]).resolve()}"

    def config_text(self) -> str:
        lines = [f"listener {self.port} 127.0.0.1"]
        if self.password_file is not None:
            lines.append("use_username_as_clientid true")
        if self.tls is not None:
            ca, cert, key = (Path(p).resolve() for p in self.tls)
            lines += [
                f"listener {self.tls_port} 127.0.0.1",
                f"cafile {ca}",
                f"certfile {cert}",
                f"keyfile {key}",
                "require_certificate true",
                "use_identity_as_username true",
                "use_username_as_clientid true",
            ]
        lines += [
            f"max_packet_size {MAX_PACKET_BYTES}",
            "set_tcp_nodelay true",
            "max_queued_messages 10000",
            "max_inflight_messages 100",
            "log_dest stderr",
            "log_type error",
            "log_type warning",
        ]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            # mosquitto started as root drops to user "mosquitto", who cannot read a private
            # temp dir; this helper is for tests and demos on loopback, so stay the caller
            lines.append(f"user {pwd.getpwuid(os.geteuid()).pw_name}")
        if self.password_file is not None:
            lines += [
                "allow_anonymous false",
                f"password_file {Path(self.password_file).resolve()}",
            ]
        else:
            lines.append("allow_anonymous true")
        if self.acl_file is not None:
            lines.append(f"acl_file {Path(self.acl_file).resolve()}")
        if self.persistence_dir is not None:
            Path(self.persistence_dir).mkdir(parents=True, exist_ok=True)
            lines += [
                "persistence true",
                f"persistence_location {Path(self.persistence_dir).resolve()}/",
            ]
        return "\n".join(lines) + "\n"

    def start(self) -> MosquittoBroker:
        conf = self.workdir / "mosquitto.conf"
        conf.write_text(self.config_text())
        self._log = open(self.workdir / "mosquitto.log", "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [self.binary, "-c", str(conf)], stdout=self._log, stderr=subprocess.STDOUT
        )
        try:
            wait_for_port("127.0.0.1", self.port)
            if self.tls_port is not None:
                wait_for_port("127.0.0.1", self.tls_port)
        except TransportError:
            self.stop()
            log_text = (self.workdir / "mosquitto.log").read_text(errors="replace")[-2000:]
            raise TransportError(
                f"mosquitto did not start on port {self.port}: {log_text}"
            ) from None
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
        if getattr(self, "_log", None) is not None:
            self._log.close()
            self._log = None

    def restart(self, down_seconds: float = 0.0) -> None:
        self.stop()
        time.sleep(down_seconds)
        self.start()

    def __enter__(self) -> MosquittoBroker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
