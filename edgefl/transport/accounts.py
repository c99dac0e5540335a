"""Mosquitto's accounts: each account's credentials (``mosquitto_passwd``) and its ACL block,
scoped to one fleet, so that device X may publish only under ``edgefl/<fleet>/devices/X/…``
(``edgefl broker add-device``); and the files Mosquitto reads, made readable by the user it drops
to when started as root."""

from __future__ import annotations

import grp
import os
import pwd
import secrets
import shutil
import subprocess
from pathlib import Path

from edgefl.errors import ConfigError, TransportError
from edgefl.transport.broker import check_device_id

#: Account roles: a device, the fleet's server, an operator (reads the fleet, rolls models out).
ROLES = ("device", "server", "operator")
#: What a device may publish (under its own id in its own fleet) and read. Not its downlink:
#: only the server writes requests, so a device cannot forge one to itself.
DEVICE_WRITES = ("up", "register", "status", "agent", "active")
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
