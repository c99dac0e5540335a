"""Runtime: the round loop, the device agent, and the in-memory simulation of a fleet.

Names are imported on first use: the device's registration (``edgefl device register``) runs on
the base install, without the torch that the agent and the loop need.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {"DeviceAgent": "agent", "LoopSettings": "loop", "RoundLoop": "loop"}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module 'edgefl.runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"edgefl.runtime.{_NAMES[name]}"), name)
    globals()[name] = value
    return value
