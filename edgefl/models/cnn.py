"""FedHeNN's family of five CNNs, from 1 conv + 1 FC to 3 conv + 3 FC.

Every tier brings its images to 1/4 resolution before flattening (tier 1 with one 4×4 max
pool, the others with two 2×2 pools; the third conv keeps the resolution), so each tier
only adds layers to the previous one and the parameter count grows strictly with the tier
(for up to 128 classes). `width` scales the conv channels (32, 64, 128); the hidden FC
sizes stay fixed. The natural features are the penultimate layer: the flattened conv
output for tiers 1–2, the last hidden FC (after ReLU) for tiers 3–5. Dropout sits before
the last hidden FC, never after the representation.

Tier 2 (conv32–pool–conv64–pool–FC, 5×5 convs) is the small Fashion-MNIST CNN.
"""

from __future__ import annotations

from torch import Tensor, nn

from edgefl.errors import ConfigError
from edgefl.models.base import BackboneModel, resolve_options
from edgefl.models.registry import register_family
from edgefl.models.spec import ModelSpec

CONV_CHANNELS = (32, 64, 128)
# tier → (number of convs, hidden FC sizes)
CNN_TIERS: dict[str, tuple[int, tuple[int, ...]]] = {
    "1": (1, ()),
    "2": (2, ()),
    "3": (2, (128,)),
    "4": (3, (128,)),
    "5": (3, (128, 64)),
}
MIN_SIZE = 4  # two 2×2 pools (or one 4×4)


class CNN(BackboneModel):
    def __init__(self, spec: ModelSpec, convs: int, hidden: tuple[int, ...], dropout: float):
        super().__init__(spec)
        in_channels, height, width = spec.in_shape
        channels = [max(1, round(c * spec.width)) for c in CONV_CHANNELS[:convs]]
        layers: list[nn.Module] = []
        for i, out_channels in enumerate(channels):
            layers += [nn.Conv2d(in_channels, out_channels, 5, padding=2), nn.ReLU()]
            if convs == 1:
                layers.append(nn.MaxPool2d(4))
            elif i < 2:
                layers.append(nn.MaxPool2d(2))
            in_channels = out_channels
        self.convs = nn.Sequential(*layers)
        dim = channels[-1] * (height // 4) * (width // 4)
        fcs: list[nn.Module] = []
        for i, size in enumerate(hidden):
            if i == len(hidden) - 1 and dropout > 0:
                fcs.append(nn.Dropout(dropout))
            fcs += [nn.Linear(dim, size), nn.ReLU()]
            dim = size
        self.hidden = nn.Sequential(*fcs)
        self._init_head(dim, spec)

    def extract(self, x: Tensor) -> Tensor:
        return self.hidden(self.convs(x).flatten(1))


@register_family(
    "cnn",
    list(CNN_TIERS),
    "FedHeNN's five CNNs: 1 conv + 1 FC (tier 1) up to 3 conv + 3 FC (tier 5); "
    "option dropout=0.5 (before the last hidden FC)",
)
def build_cnn(spec: ModelSpec) -> CNN:
    options = resolve_options(spec, {"dropout": ("0.5", None)})
    try:
        dropout = float(options["dropout"])
    except ValueError:
        dropout = -1.0
    if not 0.0 <= dropout < 1.0:
        raise ConfigError(f"option dropout must be a number in [0, 1), got {options['dropout']!r}")
    if min(spec.in_shape[1:]) < MIN_SIZE:
        raise ConfigError(
            f"model family 'cnn' needs images of at least {MIN_SIZE}x{MIN_SIZE}, got "
            f"{spec.in_shape}"
        )
    convs, hidden = CNN_TIERS[spec.tier]
    return CNN(spec, convs, hidden, dropout)
