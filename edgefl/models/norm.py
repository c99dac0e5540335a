"""The ``norm`` option every family takes: ``norm=group`` replaces each BatchNorm of the built
model with a GroupNorm over the same channels (affine, as the BatchNorm was).

BatchNorm normalises each sample with statistics of the whole batch (and keeps running
statistics of the training data in buffers), so a sample's gradient depends on its batch-mates:
per-sample gradients, and with them DP-SGD (docs/privacy.md), need a normalisation per sample.
GroupNorm has no buffers and treats each sample alone. Groups: the largest power of two up to
:data:`MAX_GROUPS` that divides the channels (32 for 64 channels, 8 for 24, 1 for 3: LayerNorm
over the channels), so every channel count of every width works; Opacus's own fix uses
``min(32, channels)``, which fails for 48 channels.

Parameter names do not change (``bn1.weight``, ``bn1.bias``); the running statistics and step
counter of the BatchNorm are gone from the state.
"""

from __future__ import annotations

import math

from torch import nn

from edgefl.errors import ConfigError

#: The values of the ``norm`` option (``batch``: the family's own normalisation, the default).
NORMS = ("batch", "group")
#: Most groups of a GroupNorm that replaces a BatchNorm (Wu & He's default).
MAX_GROUPS = 32


def norm_of(options: tuple[tuple[str, str], ...]) -> str:
    """The ``norm`` option of a spec's options (default ``batch``), checked."""
    value = dict(options).get("norm", "batch")
    if value not in NORMS:
        raise ConfigError(f"option norm={value!r}: choose one of {', '.join(NORMS)}")
    return value


def group_count(channels: int) -> int:
    return math.gcd(channels, MAX_GROUPS)


def has_batch_norm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def to_group_norm(model: nn.Module) -> int:
    """Replace every BatchNorm of ``model`` in place by a GroupNorm (see the module doc);
    returns how many were replaced."""
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.modules.batchnorm._BatchNorm):
                c = child.num_features
                norm = nn.GroupNorm(group_count(c), c, eps=child.eps, affine=True)
                setattr(parent, name, norm)
                count += 1
    return count
