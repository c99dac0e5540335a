"""HierarchyFL (Xia et al.) and its baseline HeteroFL (Diao et al., 2021).

Every device holds a sub-model of one global model: a depth tier (``hierarchy-depth``: stem +
stages 1..i + exit i of a multi-exit ResNet-18) or a width tier (``hierarchy-width``: leading
channel slices of a ResNet-18). Devices train their sub-model with cross-entropy and upload the
deltas; the server averages them layer-aligned, by name and leading slice
(:mod:`.submodels`). HeteroFL stops there. HierarchyFL then trains the global model on the
server's labelled public set (1 % of the training set) by the ensemble library and hierarchical
self-distillation, a meta-learner weighting the tiers (:mod:`.distill`).

Wire: downlink ``w/<name>`` (the sub-model), uplink ``d/<name>`` (deltas) + ``num_samples``.
The derivation, the losses and the choices that are ours: docs/methods/hierarchyfl.md.
"""

from edgefl.algorithms.base import Algorithm, MethodNeeds, register
from edgefl.algorithms.hierarchyfl.distill import (
    THETA,
    HierarchyFLOptions,
    HierarchyFLServer,
    feature_mse,
    kd_loss,
    server_lr_at,
    slice_aligned_mixture,
)
from edgefl.algorithms.hierarchyfl.submodels import (
    DELTAS,
    GLOBAL_TIERS,
    WEIGHTS,
    HeteroFLOptions,
    HeteroFLServer,
    SubModelDevice,
    aligned_average,
    global_spec,
    leading,
    state_shapes,
)

__all__ = [
    "DELTAS",
    "GLOBAL_TIERS",
    "PAPER_DEFAULTS",
    "THETA",
    "WEIGHTS",
    "HeteroFLOptions",
    "HeteroFLServer",
    "HierarchyFLOptions",
    "HierarchyFLServer",
    "SubModelDevice",
    "aligned_average",
    "feature_mse",
    "global_spec",
    "kd_loss",
    "leading",
    "server_lr_at",
    "slice_aligned_mixture",
    "state_shapes",
]

# The paper's training recipe; the width and the epochs are ours: its ResNet-18 at width 1.0 trains
# ~100 images/s on a 2-core CPU (`simulate --clients 4 --rounds 2 --train-samples 4000` took
# 421 s), at 0.125, the width of the benchmark (benchmarks/hierarchyfl) and of Felo/Velo's fleet,
# 18 s; three local epochs per round (the paper: 5) chosen on a validation split by
# benchmarks/hierarchyfl/quick_defaults (the benchmark itself sets its own epochs).
PAPER_DEFAULTS = {
    "model": "hierarchy-depth",
    "tiers": ("1", "2", "3", "4"),
    "width": 0.125,
    "optimizer": "sgd",
    "lr": 0.05,
    "momentum": 0.9,
    "weight_decay": 5e-4,
    "lr_decay_rounds": (30, 60, 90),
    "batch_size": 32,
    "epochs": 3,
    "fraction": 1.0,
}

register(
    Algorithm(
        name="hierarchyfl",
        description="HierarchyFL: sub-model deltas averaged layer-aligned, then ensemble-library "
        "self-distillation on a 1% server-held public set (depth or width tiers)",
        device=SubModelDevice,
        server=HierarchyFLServer,
        options=HierarchyFLOptions,
        defaults=PAPER_DEFAULTS,
        needs=MethodNeeds(public_share=0.01, public_use="labelled", averages_weights=True,
                          asynchronous=True, uplink_deltas=(DELTAS,)),
    )
)

register(
    Algorithm(
        name="heterofl",
        description="HeteroFL: sub-models (width or depth tiers) of one global model, deltas "
        "averaged by name and leading slice",
        device=SubModelDevice,
        server=HeteroFLServer,
        options=HeteroFLOptions,
        defaults=PAPER_DEFAULTS,
        needs=MethodNeeds(averages_weights=True, asynchronous=True, uplink_deltas=(DELTAS,)),
    )
)
