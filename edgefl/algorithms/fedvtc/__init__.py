"""FedVTC (Niu, Dong, Qin): prototypes and SD, a variational transposed-convolution decoder, and
a last phase of fine-tuning on synthetic data. Spec: ALGORITHMS.md §4.

Devices share FedProto's class prototypes of a common latent z = g_k(x) (:mod:`.device`). Each
also trains a decoder ψ_k (:mod:`.vtc`: four transposed convolutions) that maps v = z + σ ⊙ ε
back to the image, alternating per minibatch a step of the model (CE + L_tc, ψ frozen) and a
step of ψ and σ (L_tc, the model frozen). The server (:mod:`.server`) averages prototypes and
σ every round; after the last round one closing round collects every ψ_k and averages it. The
final downlink carries ψ, all prototypes and σ; each device then draws latents from
N(c^y, diag σ²), decodes them and fine-tunes its model on them with CE.

The losses, the wire, and the choices that are ours (with the measurements behind the defaults):
docs/methods/fedvtc.md.
"""

from edgefl.algorithms.base import Algorithm, MethodNeeds, register
from edgefl.algorithms.fedproto import PROTOTYPE_DEFAULTS
from edgefl.algorithms.fedvtc.device import FedVTCDevice
from edgefl.algorithms.fedvtc.options import FedVTCOptions
from edgefl.algorithms.fedvtc.server import FedVTCServer, load_oracle
from edgefl.algorithms.fedvtc.vtc import (
    PAPER_HIDDEN,
    PSI,
    SIGMA,
    TCTerms,
    VTCDecoder,
    VTCLayout,
    build_decoder,
    class_mean_sum,
    feature_statistics,
    generate,
    kl_to_prototype,
    load_decoder,
    load_generator,
    save_generator,
    tc_terms,
    vtc_layout,
)

__all__ = [
    "FEDVTC_DEFAULTS",
    "PAPER_HIDDEN",
    "PSI",
    "SIGMA",
    "FedVTCDevice",
    "FedVTCOptions",
    "FedVTCServer",
    "TCTerms",
    "VTCDecoder",
    "VTCLayout",
    "build_decoder",
    "class_mean_sum",
    "feature_statistics",
    "generate",
    "kl_to_prototype",
    "load_decoder",
    "load_generator",
    "load_oracle",
    "save_generator",
    "tc_terms",
    "vtc_layout",
]

#: FedProto's CPU fleet with two local epochs per round: at one, the 3-round quick command's
#: devices train 1–2 epochs in all (benchmarks/fedvtc/quick_defaults.md). FedProto keeps one.
FEDVTC_DEFAULTS = {**PROTOTYPE_DEFAULTS, "epochs": 2}


def psi_upload(options: FedVTCOptions) -> MethodNeeds:
    """The one-shot ψ upload after training (none when ψ travels every round); the finish is the
    synthetic fine-tune."""
    return MethodNeeds(closing_rounds=0 if options.psi_every_round else 1)


register(
    Algorithm(
        name="fedvtc",
        description="FedVTC: prototypes + SD, a variational transposed-convolution decoder, "
        "synthetic fine-tuning",
        device=FedVTCDevice,
        server=FedVTCServer,
        options=FedVTCOptions,
        defaults=FEDVTC_DEFAULTS,
        needs=psi_upload,
    )
)
