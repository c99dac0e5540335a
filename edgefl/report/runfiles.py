"""Reading a run directory's files: below both the recorder (which writes them) and the plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_rounds(run_dir: Path) -> list[dict[str, Any]]:
    lines = (Path(run_dir) / "rounds.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]
