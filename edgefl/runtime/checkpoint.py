"""The server's checkpoint (``--checkpoint-dir``): its state after every round, replaced at once
(a crash never leaves half a checkpoint), and read back to resume after the last round completed.

    DIR/server.safetensors   the server half's state_dict (metadata: rounds_completed)
    DIR/progress.json        {"rounds_completed": N}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import safetensors.numpy

STATE = "server.safetensors"
PROGRESS = "progress.json"


def save(directory: Path, state: Mapping[str, np.ndarray], rounds_completed: int) -> None:
    """Write ``state`` after ``rounds_completed`` rounds."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {k: np.require(v, requirements="C") for k, v in state.items()}
    tmp = directory / f"{STATE}.tmp"
    safetensors.numpy.save_file(arrays, tmp, metadata={"rounds_completed": str(rounds_completed)})
    tmp.replace(directory / STATE)  # atomic: a crash never leaves half a checkpoint
    (directory / PROGRESS).write_text(json.dumps({"rounds_completed": rounds_completed}))


def exists(directory: Path | None) -> bool:
    """Whether ``directory`` holds a checkpoint to resume from."""
    return directory is not None and (Path(directory) / PROGRESS).exists()


def load(directory: Path | None) -> tuple[int, dict[str, np.ndarray]] | None:
    """The rounds completed and the state of the checkpoint in ``directory``; None without one."""
    if not exists(directory):
        return None
    directory = Path(directory)
    progress = json.loads((directory / PROGRESS).read_text())
    # "completed_round" (the index from 0 of the last round) is what earlier versions wrote
    done = (
        int(progress["rounds_completed"])
        if "rounds_completed" in progress
        else int(progress["completed_round"]) + 1
    )
    return done, safetensors.numpy.load_file(directory / STATE)
