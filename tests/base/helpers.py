"""Run ``edgefl`` commands as a user of the base install would."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL = Path(__file__).with_name("synthetic-cnn.onnx")
EXTRAS = (
    "torch",
    "torchvision",
    "onnx",
    "onnxscript",
    "amqtt",
    "matplotlib",
    "cryptography",
    "aiohttp",
)

# the [images] layer (pillow): the folder tests need it, so it is blocked on request
IMAGES = ("PIL",)


def _block(modules: tuple[str, ...]) -> str:
    """Code run first in the child: imports of `modules` fail as if they were not installed."""
    return f"""
import importlib.abc, sys
class _Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {modules!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, _Missing())
"""


def edgefl_command(*args: str, block_extras: bool = True, block_images: bool = False) -> list[str]:
    blocked = (EXTRAS if block_extras else ()) + (IMAGES if block_images else ())
    code = (
        _block(blocked) if blocked else ""
    ) + "import sys; from edgefl.cli.main import main; sys.argv[0] = 'edgefl'; main()"
    return [sys.executable, "-c", code, *args]


def train_args(broker: str, wait: float) -> tuple[str, ...]:
    """``edgefl train``'s arguments for device pi-1 on synthetic data, giving up on the broker at
    ``broker`` after ``wait`` seconds."""
    return ("train", "--broker", broker, "--device-id", "pi-1", "--data", "synthetic",
            "--wait", str(wait))


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def run_edgefl(
    *args: str,
    timeout: float = 120,
    block_extras: bool = True,
    block_images: bool = False,
    extra_env=None,
    cwd=None,
) -> subprocess.CompletedProcess:
    return subprocess.run(
        edgefl_command(*args, block_extras=block_extras, block_images=block_images),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**env(), **(extra_env or {})},
        cwd=cwd,
    )


