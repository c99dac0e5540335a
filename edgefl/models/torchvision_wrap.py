"""Any torchvision classification architecture as an EdgeModel (randomly initialised).

The tier is the architecture name (`torchvision.models.list_models`); the listed tiers are a
few edge-sized ones, smallest to largest. Option `arch` may repeat the name. Weights are
never downloaded. The final Linear of the torchvision model is replaced by Identity, so its
input is the natural feature; 1-channel images are repeated to 3 channels, other channel
counts go through a 1×1 conv `adapter`.

torchvision is imported only when such a model is built or its names are listed: importing it
costs a device process ~100 MB of private memory (its dataset modules come along), which a
Raspberry Pi training a ResNet or CNN from this zoo should not pay.
"""

from __future__ import annotations

from functools import cache

import torch
from torch import Tensor, nn

from edgefl.errors import ConfigError
from edgefl.models.base import BackboneModel, resolve_options
from edgefl.models.registry import register_family
from edgefl.models.spec import ModelSpec

TV_TIERS = ["shufflenet_v2_x0_5", "mobilenet_v3_small", "efficientnet_b0", "resnet18"]
# Where torchvision keeps the final classifier, by architecture family.
CLASSIFIER_ATTRIBUTES = ("fc", "classifier", "heads", "head")
# Builders whose default adds auxiliary heads that change what forward returns in training.
NO_AUX = {
    "googlenet": {"aux_logits": False, "init_weights": True},
    "inception_v3": {"aux_logits": False, "init_weights": True},
}


@cache
def classification_models() -> frozenset[str]:
    import torchvision

    return frozenset(torchvision.models.list_models(module=torchvision.models))


def _drop_classifier(model: nn.Module, arch: str) -> None:
    """Replace the last Linear of the model's classifier with Identity."""
    for attribute in CLASSIFIER_ATTRIBUTES:
        layer = getattr(model, attribute, None)
        if isinstance(layer, nn.Linear):
            setattr(model, attribute, nn.Identity())
            return
        if isinstance(layer, nn.Sequential):
            linears = [i for i, m in enumerate(layer) if isinstance(m, nn.Linear)]
            if linears:
                layer[linears[-1]] = nn.Identity()
                return
    raise ConfigError(f"torchvision model {arch!r} has no final Linear classifier to replace")


class TorchvisionModel(BackboneModel):
    def __init__(self, spec: ModelSpec, arch: str):
        super().__init__(spec)
        channels, height, width = spec.in_shape
        self._repeat_gray = channels == 1
        self.adapter = nn.Conv2d(channels, 3, 1) if channels not in (1, 3) else None
        import torchvision

        self.backbone = torchvision.models.get_model(arch, weights=None, **NO_AUX.get(arch, {}))
        _drop_classifier(self.backbone, arch)
        try:  # the natural dim, and whether the architecture can take this input size at all
            self.eval()
            with torch.no_grad():
                natural_dim = self.extract(torch.zeros(1, channels, height, width)).shape[1]
        except (RuntimeError, ValueError) as exc:
            raise ConfigError(
                f"torchvision model {arch!r} cannot take inputs of shape {spec.in_shape}: {exc}"
            ) from None
        self.train()
        self._init_head(natural_dim, spec)

    def extract(self, x: Tensor) -> Tensor:
        if self._repeat_gray:
            x = x.expand(-1, 3, -1, -1)
        elif self.adapter is not None:
            x = self.adapter(x)
        return self.backbone(x).flatten(1)


@register_family(
    "torchvision",
    TV_TIERS,
    "any torchvision classification model, untrained; tier = architecture name "
    "(e.g. mobilenet_v3_small); width must be 1",
    extra_tier=lambda tier: tier in classification_models(),
)
def build_torchvision(spec: ModelSpec) -> TorchvisionModel:
    options = resolve_options(spec, {"arch": (spec.tier, None)})
    if options["arch"] != spec.tier:
        raise ConfigError(
            f"option arch={options['arch']!r} disagrees with tier {spec.tier!r}; "
            "the tier of the torchvision family is the architecture name"
        )
    if spec.width != 1.0:
        raise ConfigError("torchvision architectures have fixed widths; use width=1.0")
    return TorchvisionModel(spec, spec.tier)
