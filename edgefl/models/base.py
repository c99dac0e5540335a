"""The shape every model of the zoo has: extractor → features s → classifier → logits.

Parameter names are the contract between devices: heterogeneous updates are aligned by
name and leading slice, never by position, so the attribute names used here (`projection`,
`fc1`, `fc2`, `classifier`) and in the families must stay stable.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from edgefl.errors import ConfigError
from edgefl.models.spec import ModelSpec

FEDDW_HIDDEN = 256
FEDDW_DIM = 128


def parameter_count(model: nn.Module) -> int:
    """Number of scalar parameters (buffers excluded)."""
    return sum(p.numel() for p in model.parameters())


class HeadMixin:
    """Everything after the family's natural features h, shared by whole models and by the
    exits of a multi-exit model:

        h → [projection] → [fc1 + ReLU → fc2]  = s (the features)  → classifier → logits

    `projection` exists when `spec.feature_dim` is set; fc1/fc2 with `head="feddw"`, whose
    classifier has no bias (FedDW's regulariser uses `classifier.weight`), and with `head="mlp"`,
    the same layers with the usual biased classifier (FedDW's baselines: the paper's network).
    """

    feature_dim: int

    def _init_head(self, natural_dim: int, spec: ModelSpec) -> None:
        dim = natural_dim
        self.projection: nn.Linear | None = None
        if spec.feature_dim is not None:
            self.projection = nn.Linear(natural_dim, spec.feature_dim)
            dim = spec.feature_dim
        self.fc1: nn.Linear | None = None
        self.fc2: nn.Linear | None = None
        if spec.head in ("feddw", "mlp"):
            self.fc1 = nn.Linear(dim, FEDDW_HIDDEN)
            self.fc2 = nn.Linear(FEDDW_HIDDEN, FEDDW_DIM)  # no activation after it, as the paper
            self.classifier = nn.Linear(FEDDW_DIM, spec.num_classes, bias=spec.head == "mlp")
            dim = FEDDW_DIM
        else:
            self.classifier = nn.Linear(dim, spec.num_classes)
        self.feature_dim = dim

    def _head_features(self, h: Tensor) -> Tensor:
        if self.projection is not None:
            h = self.projection(h)
        if self.fc1 is not None:
            h = self.fc2(torch.relu(self.fc1(h)))
        return h

    def classify(self, s: Tensor) -> Tensor:
        """Logits [B, num_classes] from features [B, feature_dim]."""
        return self.classifier(s)


class EdgeModel(nn.Module):
    """Base of every model: images in [0, 1] of shape [B, C, H, W] in, logits out.

    Normalisation with `spec.mean`/`spec.std` happens inside the model, in non-persistent
    buffers: they never enter the state dict, so they never travel or get averaged.
    Subclasses set `feature_dim` and implement `features` and `classify`.
    """

    feature_dim: int

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        shape = (1, -1, 1, 1)
        self.register_buffer("mean", torch.tensor(spec.mean).view(shape), persistent=False)
        self.register_buffer("std", torch.tensor(spec.std).view(shape), persistent=False)

    def normalize(self, x: Tensor) -> Tensor:
        return (x - self.mean) / self.std

    def features(self, x: Tensor) -> Tensor:
        """Features s [B, feature_dim] of images x."""
        raise NotImplementedError

    def classify(self, s: Tensor) -> Tensor:
        """Logits [B, num_classes] from features s."""
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        return self.classify(self.features(x))

    @property
    def num_parameters(self) -> int:
        return parameter_count(self)


class BackboneModel(HeadMixin, EdgeModel):
    """An EdgeModel with one path: `extract` gives the natural features h [B, natural_dim],
    the head (see `HeadMixin`) does the rest. Subclasses build their layers, then call
    `self._init_head(natural_dim, spec)`."""

    def extract(self, x: Tensor) -> Tensor:
        """Natural features of normalised images."""
        raise NotImplementedError

    def features(self, x: Tensor) -> Tensor:
        return self._head_features(self.extract(self.normalize(x)))


def resolve_options(
    spec: ModelSpec, allowed: dict[str, tuple[str, tuple[str, ...] | None]]
) -> dict[str, str]:
    """The family options of `spec` with defaults filled in.

    `allowed` maps each option key to (default, choices); choices None means free-form.
    Unknown keys and values outside the choices raise ConfigError.
    """
    given = dict(spec.options)
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        known = ", ".join(sorted(allowed)) or "none"
        raise ConfigError(
            f"model family {spec.family!r} has no option {', '.join(unknown)}; options: {known}"
        )
    resolved = {}
    for key, (default, choices) in allowed.items():
        value = given.get(key, default)
        if choices is not None and value not in choices:
            raise ConfigError(
                f"option {key}={value!r} of model family {spec.family!r}; "
                f"choose one of: {', '.join(choices)}"
            )
        resolved[key] = value
    return resolved
