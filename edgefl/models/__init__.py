"""Model zoo: every model = extractor → features → classifier, built from a `ModelSpec`.

    spec = ModelSpec("resnet", "18", num_classes=10, in_shape=(3, 32, 32), width=0.25)
    model = build_model(spec)            # an EdgeModel
    s = model.features(x); logits = model.classify(s)

Families register themselves on import (see `family_names()`); heterogeneous updates are
aligned by parameter name and leading slice (`slice_state`, `write_slices`).
"""

from edgefl.models import cnn, hierarchy, resnet, torchvision_wrap  # noqa: F401  (registers)
from edgefl.models.base import EdgeModel, parameter_count
from edgefl.models.hierarchy import MultiExitResNet
from edgefl.models.registry import (
    build_model,
    family_description,
    family_names,
    family_tiers,
    register_family,
)
from edgefl.models.slicing import slice_state, write_slices
from edgefl.models.spec import ModelSpec

__all__ = [
    "EdgeModel",
    "ModelSpec",
    "MultiExitResNet",
    "build_model",
    "family_description",
    "family_names",
    "family_tiers",
    "parameter_count",
    "register_family",
    "slice_state",
    "write_slices",
]
