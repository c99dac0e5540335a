"""ResNet by depth (Felo/Velo's ResNet10–50) and the pieces the hierarchy families reuse.

Layout and names: `stem.{conv,bn}`, `stages.{0..3}.{block}.{conv1,bn1,conv2,bn2,[conv3,bn3],
downsample.{0,1}}`, then the head (`projection`, `fc1`, `fc2`, `classifier`, see base.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import Tensor, nn

from edgefl.models.base import BackboneModel, resolve_options
from edgefl.models.registry import register_family
from edgefl.models.spec import ModelSpec

Norm = Callable[[int], nn.Module]

BASE_CHANNELS = (64, 128, 256, 512)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_channels: int, planes: int, stride: int, norm: Norm):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, planes, 3, stride, 1, bias=False)
        self.bn1 = norm(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = norm(planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _shortcut(in_channels, planes, stride, norm)

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck (stride on the 3×3 conv, as torchvision)."""

    expansion = 4

    def __init__(self, in_channels: int, planes: int, stride: int, norm: Norm):
        super().__init__()
        out_channels = planes * self.expansion
        self.conv1 = nn.Conv2d(in_channels, planes, 1, bias=False)
        self.bn1 = norm(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = norm(planes)
        self.conv3 = nn.Conv2d(planes, out_channels, 1, bias=False)
        self.bn3 = norm(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _shortcut(in_channels, out_channels, stride, norm)

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


Block = type[BasicBlock] | type[Bottleneck]


def _shortcut(in_channels: int, out_channels: int, stride: int, norm: Norm) -> nn.Module | None:
    if stride == 1 and in_channels == out_channels:
        return None
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 1, stride, bias=False), norm(out_channels)
    )


class Stem(nn.Module):
    """Kind "cifar": 3×3 stride 1, no pooling (for 28–32 px inputs); kind "imagenet": 7×7
    stride 2 + 3×3 max pool, as torchvision and Felo/Velo's code; kind "stride2": the cifar stem's
    3×3 conv at stride 2, no pooling (half the resolution from the first stage on: about a third
    of the cifar stem's CPU cost on 28×28 inputs, with the same parameters)."""

    def __init__(self, in_channels: int, out_channels: int, kind: str, norm: Norm):
        super().__init__()
        if kind == "imagenet":
            self.conv = nn.Conv2d(in_channels, out_channels, 7, 2, 3, bias=False)
            self.pool = nn.MaxPool2d(3, 2, 1)
        else:
            stride = 2 if kind == "stride2" else 1
            self.conv = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
            self.pool = nn.Identity()
        self.bn = norm(out_channels)

    def forward(self, x: Tensor) -> Tensor:
        return self.pool(self.bn(self.conv(x)).relu())


def make_stages(
    block: Block, layers: Sequence[int], channels: Sequence[int], in_channels: int, norm: Norm
) -> nn.ModuleList:
    """Stage i: `layers[i]` blocks of `channels[i]` planes; all but the first halve H and W."""
    stages = nn.ModuleList()
    for i, (count, planes) in enumerate(zip(layers, channels, strict=True)):
        blocks = []
        for j in range(count):
            stride = 2 if i > 0 and j == 0 else 1
            blocks.append(block(in_channels, planes, stride, norm))
            in_channels = planes * block.expansion
        stages.append(nn.Sequential(*blocks))
    return stages


def init_conv_weights(module: nn.Module) -> None:
    """He init for convolutions (torchvision's choice); BN and Linear keep PyTorch defaults."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")


def scaled_channels(width: float) -> list[int]:
    """64·width, 128·width, 256·width, 512·width rounded, at least 1."""
    return [max(1, round(c * width)) for c in BASE_CHANNELS]


class ResNet(BackboneModel):
    """stem → stages → global average pool → flatten: natural features of
    channels[-1]·expansion dims."""

    def __init__(
        self,
        spec: ModelSpec,
        block: Block,
        layers: Sequence[int],
        channels: Sequence[int],
        stem: str = "cifar",
        norm: Norm = nn.BatchNorm2d,
    ):
        super().__init__(spec)
        self.stem = Stem(spec.in_shape[0], channels[0], stem, norm)
        self.stages = make_stages(block, layers, channels, channels[0], norm)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self._init_head(channels[-1] * block.expansion, spec)
        init_conv_weights(self)

    def extract(self, x: Tensor) -> Tensor:
        x = self.stem(x)
        for stage in self.stages:
            x = stage(x)
        return self.pool(x).flatten(1)


RESNET_LAYERS: dict[str, tuple[Block, tuple[int, int, int, int]]] = {
    "10": (BasicBlock, (1, 1, 1, 1)),
    "14": (BasicBlock, (1, 1, 2, 2)),
    "18": (BasicBlock, (2, 2, 2, 2)),
    "22": (BasicBlock, (2, 2, 3, 3)),
    "26": (BasicBlock, (3, 3, 3, 3)),
    "34": (BasicBlock, (3, 4, 6, 3)),
    "50": (Bottleneck, (3, 4, 6, 3)),
}


@register_family(
    "resnet",
    list(RESNET_LAYERS),
    "ResNet10/14/18/22/26/34 (BasicBlock) and ResNet50 (Bottleneck), as Felo/Velo; "
    "option stem=cifar (3x3, default) or imagenet (7x7/2 + max pool); "
    "features 512*width (2048*width for 50)",
)
def build_resnet(spec: ModelSpec) -> ResNet:
    options = resolve_options(spec, {"stem": ("cifar", ("cifar", "imagenet"))})
    block, layers = RESNET_LAYERS[spec.tier]
    return ResNet(spec, block, layers, scaled_channels(spec.width), stem=options["stem"])
