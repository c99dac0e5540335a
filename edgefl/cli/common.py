"""Helpers shared by command modules (so that no command module imports another)."""

from __future__ import annotations

import json
from pathlib import Path


def load_profile(path: Path | None) -> dict | None:
    if path is None:
        return None
    from edgefl.errors import ConfigError

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"cannot read the profile {path}: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"profile {path} is not a JSON object")
    return data
