"""Helpers shared by benchmark scripts: machine load, run via the CLI, write results."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
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


def edgefl_json(*args: str) -> dict:
    """Run ``edgefl simulate ... --json`` as a user would and parse its one JSON line."""
    cmd = [sys.executable, "-m", "edgefl.cli.main", "simulate", *args, "--json", "--quiet"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1]) | {"command": "edgefl simulate " + " ".join(args)}


def write_json(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n")
