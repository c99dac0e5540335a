"""HierarchyFL's model hierarchies on ResNet-18 (CIFAR stem).

- `hierarchy-depth`: a multi-exit ResNet-18. Tier i = stem + stages 1..i + exit i; the global
  model (tier "all") holds all four exits. Exit i = "bottleneck" (4 − i SepConv blocks taking
  the stage output to 512·width channels at stage 4's resolution, then global average pool)
  + head, as in the self-distillation code the paper builds on (attention modules omitted).
- `hierarchy-width`: HeteroFL-style width tiers 1/8, 1/4, 1/2, 1: every tensor of a tier is
  the leading slice of the same-named tensor of tier "1", so `slice_state`/`write_slices`
  move between them exactly.

In both, parameter names are identical to the global model's, so the server averages
layer by layer by name.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial

from torch import Tensor, nn

from edgefl.models.base import EdgeModel, HeadMixin, resolve_options
from edgefl.models.registry import register_family
from edgefl.models.resnet import (
    BASE_CHANNELS,
    BasicBlock,
    Norm,
    ResNet,
    Stem,
    init_conv_weights,
    make_stages,
    scaled_channels,
)
from edgefl.models.spec import ModelSpec

RESNET18_LAYERS = (2, 2, 2, 2)
BN_CHOICES = ("static", "running")


def batch_norm(kind: str) -> Norm:
    """BatchNorm of kind "running" (ordinary) or "static", HeteroFL's static BN, which normalises
    with the statistics of the current batch in training *and* evaluation. Sub-models of different
    widths see different data and their running statistics, averaged over devices by leading
    slice, describe no sub-model's activations; static BN avoids averaging them at all.
    The price: eval outputs depend on the batch (evaluate with large batches, or use
    "running" for a model that is exported)."""
    if kind == "running":
        return nn.BatchNorm2d
    return partial(nn.BatchNorm2d, track_running_stats=False)


# --- width tiers -----------------------------------------------------------------------------

WIDTH_RATES = {"1/8": 0.125, "1/4": 0.25, "1/2": 0.5, "1": 1.0}


def width_tier_channels(rate: float, width: float) -> list[int]:
    """ceil(rate · c) for the global channels c = 64·width … 512·width, as HeteroFL.
    Rates are powers of two, so rate · c ≤ c holds exactly and every tier is a leading slice."""
    return [max(1, math.ceil(rate * (c * width))) for c in BASE_CHANNELS]


@register_family(
    "hierarchy-width",
    list(WIDTH_RATES),
    "HeteroFL/HierarchyFL width tiers of ResNet-18 (CIFAR stem): leading channel slices "
    "1/8, 1/4, 1/2, 1 of the global model; option bn=static (default) or running",
)
def build_hierarchy_width(spec: ModelSpec) -> ResNet:
    options = resolve_options(spec, {"bn": ("static", BN_CHOICES)})
    channels = width_tier_channels(WIDTH_RATES[spec.tier], spec.width)
    return ResNet(spec, BasicBlock, RESNET18_LAYERS, channels, "cifar", batch_norm(options["bn"]))


# --- depth tiers (multi-exit) --------------------------------------------------------------------

DEPTH_TIERS = ("1", "2", "3", "4")
GLOBAL_TIER = "all"
#: the stems of the depth tiers: the CIFAR stem (the paper's), or its conv at stride 2
DEPTH_STEMS = ("cifar", "stride2")


class SepConv(nn.Module):
    """Depthwise-separable conv pair that halves H and W (self-distillation's SepConv)."""

    def __init__(self, in_channels: int, out_channels: int, norm: Norm):
        super().__init__()
        self.op = nn.Sequential(
            nn.Conv2d(in_channels, in_channels, 3, 2, 1, groups=in_channels, bias=False),
            nn.Conv2d(in_channels, in_channels, 1, bias=False),
            norm(in_channels),
            nn.ReLU(),
            nn.Conv2d(in_channels, in_channels, 3, 1, 1, groups=in_channels, bias=False),
            nn.Conv2d(in_channels, out_channels, 1, bias=False),
            norm(out_channels),
            nn.ReLU(),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.op(x)


class Exit(HeadMixin, nn.Module):
    """The exit after stage `stage` (1-based): bottleneck to channels[-1] dims, then the head."""

    def __init__(self, spec: ModelSpec, channels: Sequence[int], stage: int, norm: Norm):
        super().__init__()
        convs = [SepConv(channels[k - 1], channels[k], norm) for k in range(stage, len(channels))]
        self.bottleneck = nn.Sequential(*convs, nn.AdaptiveAvgPool2d(1), nn.Flatten(1))
        self._init_head(channels[-1], spec)

    def features(self, h: Tensor) -> Tensor:
        return self._head_features(self.bottleneck(h))


class MultiExitResNet(EdgeModel):
    """Stem + the first `depth` stages of ResNet-18 + exits keyed "1".."4" in `exits`.

    `features`/`classify`/`forward` use the deepest exit held; `forward_exits` gives
    (features, logits) of every exit held, shallowest first.
    """

    def __init__(
        self, spec: ModelSpec, depth: int, exits: Sequence[int], norm: Norm, stem: str = "cifar"
    ):
        super().__init__(spec)
        channels = scaled_channels(spec.width)
        self.stem = Stem(spec.in_shape[0], channels[0], stem, norm)
        self.stages = make_stages(
            BasicBlock, RESNET18_LAYERS[:depth], channels[:depth], channels[0], norm
        )
        self.exits = nn.ModuleDict({str(i): Exit(spec, channels, i, norm) for i in exits})
        self._deepest = str(max(exits))
        self.feature_dim = self.exits[self._deepest].feature_dim
        init_conv_weights(self)

    @property
    def classifier(self) -> nn.Linear:
        return self.exits[self._deepest].classifier

    def _trunk(self, x: Tensor) -> Tensor:
        h = self.stem(self.normalize(x))
        for stage in self.stages:
            h = stage(h)
        return h

    def features(self, x: Tensor) -> Tensor:
        return self.exits[self._deepest].features(self._trunk(x))

    def classify(self, s: Tensor) -> Tensor:
        return self.exits[self._deepest].classify(s)

    def forward_exits(self, x: Tensor) -> list[tuple[Tensor, Tensor]]:
        outputs = []
        h = self.stem(self.normalize(x))
        for i, stage in enumerate(self.stages, start=1):
            h = stage(h)
            if str(i) in self.exits:
                head = self.exits[str(i)]
                s = head.features(h)
                outputs.append((s, head.classify(s)))
        return outputs


@register_family(
    "hierarchy-depth",
    list(DEPTH_TIERS),
    "HierarchyFL multi-exit ResNet-18 (CIFAR stem): tier i = stages 1..i + exit i; "
    f"tier {GLOBAL_TIER!r} builds the global model with all exits; "
    "option bn=running (default) or static; option stem=cifar (3x3, default) or stride2 (the same "
    "3x3 conv at stride 2: half the resolution, about a third of the CPU cost on 28x28)",
    extra_tier=lambda tier: tier == GLOBAL_TIER,
)
def build_hierarchy_depth(spec: ModelSpec) -> MultiExitResNet:
    options = resolve_options(
        spec, {"bn": ("running", BN_CHOICES), "stem": ("cifar", DEPTH_STEMS)}
    )
    norm = batch_norm(options["bn"])
    if spec.tier == GLOBAL_TIER:
        depth, exits = len(DEPTH_TIERS), range(1, len(DEPTH_TIERS) + 1)
    else:
        depth, exits = int(spec.tier), [int(spec.tier)]
    return MultiExitResNet(spec, depth, exits, norm, options["stem"])
