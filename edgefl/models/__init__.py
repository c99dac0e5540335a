"""Model zoo: every model = extractor → features → classifier, built from a `ModelSpec`.

    spec = ModelSpec("resnet", "18", num_classes=10, in_shape=(3, 32, 32), width=0.25)
    model = build_model(spec)            # an EdgeModel
    s = model.features(x); logits = model.classify(s)

Families register themselves on import (see `family_names()`); heterogeneous updates are
aligned by parameter name and leading slice (`slice_state`, `write_slices`).

`ModelSpec` needs no torch (ONNX inference and registration read it on torch-free devices);
every other name is imported on first use, which also registers the families.
"""

from __future__ import annotations

import importlib
from typing import Any

from edgefl.models.spec import ModelSpec

_NAMES = {
    "EdgeModel": "base",
    "parameter_count": "base",
    "MultiExitResNet": "hierarchy",
    "build_model": "registry",
    "family_description": "registry",
    "family_names": "registry",
    "family_tiers": "registry",
    "for_dp_sgd": "registry",
    "register_family": "registry",
    "slice_state": "slicing",
    "write_slices": "slicing",
}

__all__ = ["ModelSpec", *sorted(_NAMES)]


# Lazy on purpose: these names import torch, and ModelSpec (above) must not: ONNX inference and
# registration read it on torch-free devices (the base install). Loading them also registers the
# families.
def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module 'edgefl.models' has no attribute {name!r}")
    for family in ("cnn", "hierarchy", "resnet", "torchvision_wrap"):  # registers the families
        importlib.import_module(f"edgefl.models.{family}")
    value = getattr(importlib.import_module(f"edgefl.models.{_NAMES[name]}"), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return __all__
