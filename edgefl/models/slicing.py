"""Leading-slice views between a global state dict and a width-sliced sub-model's.

HeteroFL / HierarchyFL width tiers keep the same parameter names as the global model and
use the leading channels of every tensor, so a sub-model is `global[:s0, :s1, ...]`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from edgefl.errors import ConfigError


def _leading(global_state: dict[str, Tensor], name: str, shape: torch.Size) -> tuple[slice, ...]:
    if name not in global_state:
        raise ConfigError(f"parameter {name!r} is not in the global model")
    full = global_state[name].shape
    if len(shape) != len(full) or any(s > f for s, f in zip(shape, full, strict=True)):
        raise ConfigError(
            f"parameter {name!r}: shape {tuple(shape)} is not a leading slice of {tuple(full)}"
        )
    return tuple(slice(0, s) for s in shape)


def slice_state(
    global_state: dict[str, Tensor], shapes: dict[str, torch.Size]
) -> dict[str, Tensor]:
    """For each name in `shapes`, a copy of the leading slice of the global tensor."""
    regions = {name: _leading(global_state, name, torch.Size(s)) for name, s in shapes.items()}
    return {name: global_state[name][region].clone() for name, region in regions.items()}


def write_slices(global_state: dict[str, Tensor], sub_state: dict[str, Tensor]) -> None:
    """Write each sub-model tensor into the leading slice of its global tensor, in place.

    With `global_state = model.state_dict()` this updates the model itself.
    """
    regions = {name: _leading(global_state, name, t.shape) for name, t in sub_state.items()}
    with torch.no_grad():
        for name, region in regions.items():
            global_state[name][region].copy_(sub_state[name])
