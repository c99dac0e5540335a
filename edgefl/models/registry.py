"""Name → builder registry of model families (torchvision-style: refuses duplicates)."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from edgefl.errors import UnknownNameError
from edgefl.models.base import EdgeModel
from edgefl.models.norm import has_batch_norm, norm_of, to_group_norm
from edgefl.models.spec import ModelSpec

log = logging.getLogger(__name__)

Builder = Callable[[ModelSpec], EdgeModel]


@dataclass(frozen=True)
class Family:
    name: str
    tiers: tuple[str, ...]  # smallest → largest
    description: str
    builder: Builder
    # Tiers build_model accepts beyond the listed ones (the multi-exit global model,
    # any torchvision architecture); they are not part of the size ladder.
    extra_tier: Callable[[str], bool] | None = None

    def accepts(self, tier: str) -> bool:
        return tier in self.tiers or (self.extra_tier is not None and self.extra_tier(tier))


_FAMILIES: dict[str, Family] = {}


def register_family(
    name: str,
    tiers: list[str],
    description: str,
    *,
    extra_tier: Callable[[str], bool] | None = None,
) -> Callable[[Builder], Builder]:
    """Decorator registering `fn(spec) -> EdgeModel` as the builder of family `name`.

    `tiers` are ordered smallest → largest. `extra_tier(tier)` may accept further tiers that
    are buildable but not part of that ladder.
    """
    if not tiers or len(set(tiers)) != len(tiers):
        raise ValueError(f"model family {name!r} needs distinct tiers, got {tiers}")

    def decorate(fn: Builder) -> Builder:
        if name in _FAMILIES:
            raise ValueError(f"model family {name!r} is already registered")
        _FAMILIES[name] = Family(name, tuple(tiers), description, fn, extra_tier)
        return fn

    return decorate


def family_names() -> list[str]:
    return sorted(_FAMILIES)


def _family(name: str) -> Family:
    try:
        return _FAMILIES[name]
    except KeyError:
        raise UnknownNameError("model family", name, family_names()) from None


def family_tiers(family: str) -> list[str]:
    """The tiers of `family`, smallest → largest."""
    return list(_family(family).tiers)


def family_description(family: str) -> str:
    return _family(family).description


def build_model(spec: ModelSpec) -> EdgeModel:
    """Build the model `spec` describes (freshly initialised; seed torch for reproducibility).

    The option `norm` belongs to every family (`edgefl.models.norm`): the family builds the
    model without it, and `norm=group` then swaps its BatchNorms for GroupNorms."""
    family = _family(spec.family)
    if not family.accepts(spec.tier):
        raise UnknownNameError(f"tier of {family.name}", spec.tier, family.tiers)
    norm = norm_of(spec.options)
    own = dataclasses.replace(spec, options=tuple(kv for kv in spec.options if kv[0] != "norm"))
    model = family.builder(own)
    if not isinstance(model, EdgeModel) or model.spec != own:
        raise TypeError(
            f"the builder of model family {family.name!r} must return an EdgeModel of the spec"
        )
    if norm == "group":
        to_group_norm(model)
    model.spec = spec
    return model


@functools.lru_cache(maxsize=256)
def for_dp_sgd(spec: ModelSpec) -> ModelSpec:
    """``spec`` as DP-SGD trains it: with ``norm=group`` where its model has BatchNorm (said in
    the log), unchanged where it has none or where the spec sets ``norm`` itself (``norm=batch``
    is then refused by the device, with Opacus's reason)."""
    if "norm" in dict(spec.options):
        return spec
    with torch.random.fork_rng():  # the check draws no number of the run's streams
        model = build_model(spec)
    if not has_batch_norm(model):
        return spec
    log.warning(
        "dp=sgd: %s normalises with BatchNorm, which mixes the samples of a batch; DP-SGD trains "
        "it "
        "with GroupNorm instead (model option norm=group)",
        spec.name,
    )
    return dataclasses.replace(spec, options=(*spec.options, ("norm", "group")))
