"""Brokers: the embedded amqtt broker (zero setup) and a Mosquitto process (production, tests).

Embedded (MQTT 3.1.1, anonymous, loopback only)::

    with EmbeddedBroker(port=0) as broker:      # port 0: a free port
        print(broker.url)                       # mqtt://127.0.0.1:PORT

It runs amqtt on its own asyncio loop in a background thread, so it can live inside the server
or the ``simulate --transport mqtt`` launcher, or alone under ``edgefl broker start``.

Mosquitto (MQTT 5) from ``broker/mosquitto.conf`` or a generated test config::

    with MosquittoBroker(port=0, password_file=..., acl_file=...) as broker: ...

``add_device`` creates a device's credentials (``mosquitto_passwd``) and its ACL block, so that
device X may publish only under ``edgefl/<fleet>/devices/X/…``.
"""

from __future__ import annotations

import asyncio
import grp
import logging
import os
import pwd
import re
import secrets
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


# --- credentials and ACL --------------------------------------------------------------------------

#: Account roles: a device, the fleet's server, an operator (reads the fleet, rolls models out).
ROLES = ("device", "server", "operator")
#: What a device may publish (under its own id in its own fleet) and read. Not its downlink:
#: only the server writes requests, so a device cannot forge one to itself.
DEVICE_WRITES = ("up", "register", "status", "active")
DEVICE_READS = ("down", "model")


def acl_block(username: str, fleet: str = "default", *, role: str = "device") -> str:
    """Mosquitto ACL lines for one account, scoped to one fleet.

    A device writes only its own uplink topics and reads only its own downlinks, its fleet's
    broadcast and the server's status; the server reads and writes its fleet; an operator reads
    its fleet (fleet status, dashboard) and writes the devices' model topics (``edgefl deploy``).
    """
    from edgefl.transport.mqtt import Topics

    check_device_id(username)
    root = Topics(fleet).root  # checks the fleet name
    if role == "server":
        return f"user {username}\ntopic readwrite {root}/#\n"
    if role == "operator":
        return f"user {username}\ntopic read {root}/#\ntopic write {root}/devices/+/model\n"
    if role != "device":
        raise ConfigError(f"unknown role {role!r}; choose from {', '.join(ROLES)}")
    lines = [f"user {username}"]
    lines += [f"topic write {root}/devices/{username}/{leaf}" for leaf in DEVICE_WRITES]
    lines += [f"topic read {root}/devices/{username}/{leaf}" for leaf in DEVICE_READS]
    lines += [f"topic read {root}/broadcast", f"topic read {root}/server/status"]
    return "\n".join(lines) + "\n"


def add_acl(
    acl_file: Path,
    username: str,
    fleet: str = "default",
    *,
    role: str = "device",
    replace: bool = False,
) -> None:
    """Append ``username``'s block unless the file has one (an account belongs to one fleet);
    ``replace``: drop the existing block first."""
    block = acl_block(username, fleet, role=role)
    acl_file = Path(acl_file)
    acl_file.parent.mkdir(parents=True, exist_ok=True)
    existing = acl_file.read_text() if acl_file.exists() else ""
    if replace:
        existing = _without_block(existing, username)
        acl_file.write_text(existing)
    elif f"user {username}\n" in existing:
        return
    with acl_file.open("a") as f:
        f.write(("\n" if existing and not existing.endswith("\n\n") else "") + block)
    for_mosquitto(acl_file)


def _without_block(text: str, username: str) -> str:
    """The ACL text without ``username``'s block (from its ``user`` line to the next one)."""
    out, skipping = [], False
    for line in text.splitlines(keepends=True):
        if line.startswith("user "):
            skipping = line.strip() == f"user {username}"
        if not skipping:
            out.append(line)
    return "".join(out)


def existing_account(password_file: Path | None, acl_file: Path, username: str) -> list[str]:
    """Where ``username`` already has an account: the password file, the ACL file."""
    found = []
    if password_file is not None and Path(password_file).is_file():
        if any(
            line.split(":", 1)[0] == username
            for line in Path(password_file).read_text().splitlines()
        ):
            found.append(str(password_file))
    if Path(acl_file).is_file() and f"user {username}\n" in Path(acl_file).read_text():
        found.append(str(acl_file))
    return found


def mosquitto_user() -> pwd.struct_passwd | None:
    """The system user Mosquitto drops to when started as root (Debian's package creates it)."""
    try:
        return pwd.getpwnam("mosquitto")
    except KeyError:
        return None


def for_mosquitto(path: Path, mode: int = 0o600) -> None:
    """Make a file Mosquitto reads (its key, the password and ACL files) readable by Mosquitto.

    Started as root, Mosquitto drops to the ``mosquitto`` user before it opens its files, so a
    root-owned 0600 file is "Permission denied". Run by root, the ``edgefl broker`` commands give
    such files to that user (mode 0600: nobody else reads them; root still can). Run by anyone
    else the files stay theirs, and Mosquitto started by the same user reads them."""
    user = mosquitto_user()
    if os.geteuid() == 0 and user is not None:
        os.chown(path, user.pw_uid, user.pw_gid)
    os.chmod(path, mode)


def mosquitto_blocked_by(path: Path) -> Path | None:
    """The first directory above ``path`` that the ``mosquitto`` user cannot enter (e.g. /root,
    mode 0700), when root runs this and that user exists; else None."""
    import stat

    user = mosquitto_user()
    if os.geteuid() != 0 or user is None:
        return None
    groups = {user.pw_gid} | {g.gr_gid for g in grp.getgrall() if user.pw_name in g.gr_mem}
    for directory in reversed(Path(path).resolve().parents):
        st = directory.stat()
        bit = (
            stat.S_IXUSR
            if st.st_uid == user.pw_uid
            else stat.S_IXGRP
            if st.st_gid in groups
            else stat.S_IXOTH
        )
        if not st.st_mode & bit:
            return directory
    return None


def persistence_dir(directory: Path) -> Path:
    """Mosquitto's ``persistence_location`` (``broker/data/`` in broker/*.conf), writable by it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for_mosquitto(directory, 0o700)
    return directory


def add_user(
    password_file: Path,
    acl_file: Path,
    username: str,
    password: str | None = None,
    *,
    fleet: str = "default",
    role: str = "device",
    replace: bool = False,
) -> str:
    """Create ``username``'s password and append its ACL block; returns the password. An account
    that exists is refused unless ``replace`` (then its password and ACL block are replaced)."""
    tool = shutil.which("mosquitto_passwd")
    if tool is None:
        raise TransportError(
            "mosquitto_passwd is not installed (it comes with the mosquitto package)"
        )
    check_device_id(username)
    acl_block(username, fleet, role=role)  # validate before touching any file
    password_file = Path(password_file)
    found = existing_account(password_file, acl_file, username)
    if found and not replace:
        raise ConfigError(
            f"{username} already has an account ({', '.join(found)}); --force replaces its "
            "password and ACL block"
        )
    password = password or secrets.token_urlsafe(18)
    password_file.parent.mkdir(parents=True, exist_ok=True)
    args = [tool, "-b", str(password_file), username, password]
    if not password_file.exists():
        args.insert(1, "-c")
    result = subprocess.run(args, capture_output=True, text=True)
    if result.returncode != 0:
        raise TransportError(
            f"mosquitto_passwd failed: {result.stderr.strip() or result.stdout.strip()}"
        )
    for_mosquitto(password_file)
    add_acl(acl_file, username, fleet, role=role, replace=replace)
    return password
