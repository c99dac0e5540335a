"""Run ``edgefl`` commands as a user of the base install would."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL = Path(__file__).with_name("synthetic-cnn.onnx")
EXTRAS = ("torch", "torchvision", "onnx", "onnxscript", "amqtt", "matplotlib", "cryptography", "aiohttp")

# Run first in the child: imports of the optional layers fail as if they were not installed.
_BLOCK = f"""
import importlib.abc, sys
class _Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {EXTRAS!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, _Missing())
"""


def edgefl_command(*args: str, block_extras: bool = True) -> list[str]:
    code = (_BLOCK if block_extras else "") + "import sys; from edgefl.cli.main import main; sys.argv[0] = 'edgefl'; main()"
    return [sys.executable, "-c", code, *args]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def run_edgefl(*args: str, timeout: float = 120, block_extras: bool = True, extra_env=None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        edgefl_command(*args, block_extras=block_extras), capture_output=True, text=True, timeout=timeout,
        env={**env(), **(extra_env or {})}, cwd=cwd,
    )


