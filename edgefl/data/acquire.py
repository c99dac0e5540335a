"""Getting Fashion-MNIST onto a machine: Debian's package first, torchvision's mirror second."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

from edgefl.data.sources import FASHION_MNIST_SYSTEM_DIR, locate_idx
from edgefl.errors import DataNotFoundError

log = logging.getLogger(__name__)

_APT_PACKAGE = "dataset-fashion-mnist"


def ensure_fashion_mnist(
    data_dir: str | Path | None = None, allow_apt: bool = True, allow_download: bool = True
) -> Path:
    """Return a directory holding both splits of Fashion-MNIST, installing them if needed.

    Tries, in order: the directories ``load_dataset`` searches (only ``data_dir`` when given);
    ``apt-get install dataset-fashion-mnist`` when running as root on a Debian-like system;
    torchvision's download into ``data_dir`` or ./data/fashion-mnist. Pass the returned
    directory as ``data_dir`` to ``load_dataset``.
    """
    try:
        return locate_idx("fashion-mnist", data_dir)
    except DataNotFoundError as exc:
        missing = str(exc)

    tried = []
    if allow_apt:
        error = _apt_install()
        if error is None:
            try:
                return locate_idx("fashion-mnist", FASHION_MNIST_SYSTEM_DIR)
            except DataNotFoundError:
                error = f"installed, but the files are not in {FASHION_MNIST_SYSTEM_DIR}"
        tried.append(f"apt-get install {_APT_PACKAGE} ({error})")
    if allow_download:
        target = (
            Path.cwd() / "data" / "fashion-mnist"
            if data_dir is None
            else Path(data_dir).expanduser()
        )
        error = _torchvision_download(target)
        if error is None:
            return locate_idx("fashion-mnist", target)
        tried.append(f"torchvision download into {target} ({error})")
    raise DataNotFoundError(missing + (f" Tried: {'; '.join(tried)}." if tried else ""))


def _apt_install() -> str | None:
    """Install the Debian package; returns None on success, else the reason it was not."""
    if shutil.which("apt-get") is None:
        return "no apt-get on this system"
    geteuid = getattr(os, "geteuid", None)  # absent on Windows
    if geteuid is None or geteuid() != 0:
        return "not root; run `sudo apt-get install dataset-fashion-mnist` yourself"
    install = ["apt-get", "install", "-y", "--no-install-recommends", _APT_PACKAGE]
    # A fresh container often has empty package lists; update only when the install needs it.
    if _run(install) or (_run(["apt-get", "update"]) and _run(install)):
        return None
    return "apt-get failed, see the log above"


def _run(command: list[str]) -> bool:
    log.info("running %s", " ".join(command))
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("%s failed: %s", command[0], exc)
        return False
    if result.returncode != 0:
        log.warning(
            "%s exited %d: %s", " ".join(command), result.returncode, result.stderr.strip()[-500:]
        )
    return result.returncode == 0


def _torchvision_download(target: Path) -> str | None:
    """Download into ``target/FashionMNIST/raw``; returns None on success, else the reason."""
    try:
        from torchvision.datasets import FashionMNIST

        FashionMNIST(str(target), train=True, download=True)  # fetches both splits
    # A failed fetch is an OSError (URLError) and a bad checksum a RuntimeError.
    except (ImportError, OSError, RuntimeError) as exc:
        log.warning("torchvision download failed: %s", exc)
        return str(exc) or type(exc).__name__
    return None
