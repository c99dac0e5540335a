"""What this device is: board, CPU, memory, accelerator (``root`` injectable so that tests can
fake ``/proc`` and ``/etc``)."""

from __future__ import annotations

import platform
from pathlib import Path


def _read(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8", "replace").replace("\x00", "").strip() or None
    except OSError:
        return None


def read_board(root: Path | str = "/") -> str | None:
    """The device-tree model ("Raspberry Pi 4 Model B Rev 1.4", "NVIDIA Jetson Orin Nano …")."""
    root = Path(root)
    return _read(root / "proc/device-tree/model") or _read(
        root / "sys/firmware/devicetree/base/model"
    )


def jetson_release(root: Path | str = "/") -> str | None:
    """The L4T release line of a Jetson ("R32 (release), REVISION: 7.1"), else None."""
    text = _read(Path(root) / "etc/nv_tegra_release")
    if text is None:
        return None
    line = text.splitlines()[0].lstrip("# ").strip()
    return ", ".join(part.strip() for part in line.split(",")[:2]) or None


def detect_kind(root: Path | str = "/", *, cuda: bool | None = None) -> tuple[str, str | None]:
    """(kind, board): "jetson", "raspberry-pi", "cuda-host" or "cpu", and the device-tree model."""
    board = read_board(root)
    if jetson_release(root) or (board and "jetson" in board.lower()):
        return "jetson", board
    if board and "raspberry pi" in board.lower():
        return "raspberry-pi", board
    if cuda if cuda is not None else _cuda_available():
        return "cuda-host", board
    return "cpu", board


def cpu_model(root: Path | str = "/") -> str:
    """CPU model name from /proc/cpuinfo ("model name", or "Model"/"Hardware" on ARM boards)."""
    text = _read(Path(root) / "proc/cpuinfo") or ""
    found: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip():
            found.setdefault(key.strip().lower(), value.strip())
    for key in ("model name", "cpu model", "hardware", "model", "processor"):
        value = found.get(key)
        if value and not value.isdigit():
            return value
    return platform.processor() or platform.machine() or "unknown"


def memory_mb(root: Path | str = "/") -> tuple[int, int]:
    """(total, available) RAM in MiB from /proc/meminfo; psutil where there is none."""
    text = _read(Path(root) / "proc/meminfo")
    if text:
        values = {}
        for line in text.splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                values[key.strip()] = int(parts[0]) // 1024  # kB → MiB
        if "MemTotal" in values:
            total = values["MemTotal"]
            return total, min(total, values.get("MemAvailable", values.get("MemFree", total)))
    import psutil

    vm = psutil.virtual_memory()
    return vm.total // 2**20, vm.available // 2**20


def _torch():
    """The torch module, or None on the base install."""
    try:
        import torch
    except ModuleNotFoundError:
        return None
    return torch


def _cuda_available() -> bool:
    torch = _torch()
    return torch is not None and torch.cuda.is_available()


def _accelerator(kind: str, board: str | None) -> tuple[str | None, int | None]:
    if _cuda_available():
        import torch

        props = torch.cuda.get_device_properties(0)
        return f"cuda:{props.name}", props.total_memory // 2**20
    if kind == "jetson":
        return f"jetson:{board or 'unknown'} (no CUDA torch)", None
    return None, None
