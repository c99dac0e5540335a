"""Model state ↔ payload arrays. Names are kept: heterogeneous updates align by name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch is imported where it is used: the envelope travels on torch-free devices
    import torch


def state_to_arrays(state: Mapping[str, torch.Tensor], prefix: str = "w/") -> dict[str, np.ndarray]:
    """Float tensors travel as float32, integer buffers (BN's num_batches_tracked) as int64."""
    out = {}
    for name, t in state.items():
        t = t.detach().cpu()
        out[prefix + name] = t.numpy().astype(
            np.float32 if t.is_floating_point() else np.int64, copy=True
        )
    return out


def arrays_to_state(
    arrays: Mapping[str, np.ndarray], prefix: str = "w/"
) -> dict[str, torch.Tensor]:
    import torch

    n = len(prefix)
    return {k[n:]: torch.from_numpy(np.array(v)) for k, v in arrays.items() if k.startswith(prefix)}
