"""Helpers shared by the timing benchmarks (inference, overhead, mqtt_demo): machine load, write results.

The accuracy benchmarks are declarations on :mod:`benchmarks.runner` instead."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import psutil


def machine() -> dict:
    """What a timing needs next to it: the machine and how loaded it was."""
    return {
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "ram_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "loadavg_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def write_json(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n")
