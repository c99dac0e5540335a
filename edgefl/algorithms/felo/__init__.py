"""Felo and Velo (Chan & Ngai), and the FedHe baseline: per-class features and logits.

``fedhe``  devices train on CE + α·KL to the server's per-class mean logits and upload their own
           per-class mean logits with counts; no features, no weights travel.
``felo``   FedHe plus an MSE to the server's per-class mean features (uploaded too), and the
           weights of the device's own architecture averaged over that round's devices of that
           architecture, when another device of the fleet has it.
``velo``   Felo whose server trains a conditional VAE on uploaded feature points and sends one
           synthetic feature per class decoded from z ~ N(0, I) in place of the averages.

One device half, server half and options type per method (:mod:`.device`; :mod:`.server` and
:mod:`.velo`; :mod:`.options`), each extending the one before. The losses, what travels, the
defences and the choices that are ours: docs/methods/felo.md.
"""

from dataclasses import replace

from edgefl.algorithms.base import Algorithm, MethodNeeds, register
from edgefl.algorithms.felo.device import (
    FedHeDevice,
    FeloDevice,
    KnowledgeCollector,
    LossTerms,
    VeloDevice,
    felo_loss,
)
from edgefl.algorithms.felo.options import WEIGHTS, FedHeOptions, FeloOptions, VeloOptions
from edgefl.algorithms.felo.server import ClassHistory, FedHeServer, FeloServer
from edgefl.algorithms.felo.velo import VeloServer

__all__ = [
    "DEPTH_TIERS",
    "EXTREME_TIERS",
    "PAPER_DEFAULTS",
    "WEIGHTS",
    "ClassHistory",
    "FedHeDevice",
    "FedHeOptions",
    "FedHeServer",
    "FeloDevice",
    "FeloOptions",
    "FeloServer",
    "KnowledgeCollector",
    "LossTerms",
    "VeloDevice",
    "VeloOptions",
    "VeloServer",
    "felo_loss",
    "shares_weights",
]

DEPTH_TIERS = ("10", "14", "18", "22", "26")
#: The paper's "extreme" fleet; needs a common ``feature_dim`` (ResNet50's features are 4× wider).
EXTREME_TIERS = ("10", "18", "26", "34", "50")

#: The paper's heterogeneous fleet, CPU-sized: ResNet10–26 with the 7×7/2 stem of the authors'
#: code at width 0.125 (64-d features), Adam 1e-3, batch 50 (the code's). The local budget is
#: ours: the code's 10 steps per participation at 20 % participation leave every device far from
#: converged over a CPU-sized run (Local at 37 % on Fashion-MNIST), so every device trains two
#: local epochs every round (benchmarks/felo_velo runs 12 such rounds).
PAPER_DEFAULTS = {
    "model": "resnet",
    "tiers": DEPTH_TIERS,
    "model_options": {"stem": "imagenet"},
    "width": 0.125,
    "optimizer": "adam",
    "lr": 1e-3,
    "batch_size": 50,
    "epochs": 2,
    "fraction": 1.0,
}


def shares_weights(options: FeloOptions) -> MethodNeeds:
    """Felo and Velo average the weights within each architecture unless
    ``average_weights=false``."""
    return MethodNeeds(averages_weights=options.shares_weights)


FELO = register(
    Algorithm(
        name="felo",
        description="Felo: distil class-wise averaged features and logits; FedAvg within each "
        "architecture",
        device=FeloDevice,
        server=FeloServer,
        options=FeloOptions,
        defaults=PAPER_DEFAULTS,
        needs=shares_weights,
    )
)
#: Felo with Velo's server (a CVAE's features): Felo's defaults and needs.
register(replace(
    FELO, name="velo", device=VeloDevice, server=VeloServer, options=VeloOptions,
    description="Velo: Felo with a server CVAE that generates the per-class features",
))
register(
    Algorithm(
        name="fedhe",
        description="FedHe: distil class-wise averaged logits only (heterogeneous models, no "
        "weights travel)",
        device=FedHeDevice,
        server=FedHeServer,
        options=FedHeOptions,
        defaults=PAPER_DEFAULTS,
    )
)
