"""FedVTC's options (:mod:`edgefl.algorithms.fedvtc`); what each choice does and why its default
is what it is: docs/methods/fedvtc.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class FedVTCOptions:
    lam: float = 0.1  # λ of L_dm; 0 = the "L_e only" ablation
    tc_weight: float = 0.001  # weight of L_tc in the model's step (a); 1.0 = the paper's loss
    align_weight: float | None = None  # weight of KL's pull of z onto c^y in (a); None = tc_weight
    # step (b) also decodes v ~ N(c^y, σ²) around the *global* prototype towards the batch's
    # images of class y, so that every ψ_k is trained on the same latent region before they are
    # averaged. Not in the paper, whose ψ_k only see each device's own z (0 = the paper): there
    # the averaged ψ decoded one image for every class (oracle 10 %) and the fine-tune halved
    # accuracy; at 10 the oracle reaches 45–46 % and the fine-tune adds 6–12 points
    # (benchmarks/fedvtc, decoder sweep)
    proto_rc_weight: float = 10.0
    # the averaged ψ's BatchNorm statistics: "average" (the paper: the mean of the uploads'
    # running statistics) or "recalibrate" (re-estimated by the server on latents
    # v ~ N(c^y, diag σ²) of the known classes, the inputs ψ will decode; averaged weights do not
    # produce the averaged statistics)
    psi_bn: Literal["average", "recalibrate"] = "recalibrate"
    vtc_optimizer: Literal["adam", "same"] = "adam"
    vtc_lr: float = 1e-3  # for ψ and σ with vtc_optimizer=adam
    init_sigma: float | None = None  # None: each device's spread of z around its class means
    init_prototypes: Literal["local", "zero"] = "local"  # a class without a global prototype yet
    synthetic_samples: int = 500  # S, split evenly over the classes with a prototype
    finetune_epochs: int = 5  # 𝒯
    # None: the run's lr (the paper). 0.001: a tenth of the fleet's SGD lr, so a ψ that is still
    # poor after a few rounds does not undo the real-data training
    # (benchmarks/fedvtc/quick_defaults.md)
    finetune_lr: float | None = 0.001
    sample_sigma_scale: float = 1.0  # generate from N(c^y, diag (scale·σ)²); 1.0 = the paper
    psi_every_round: bool = False  # the paper's per-round TC transmission ablation
    vtc_channels: tuple[int, ...] = ()  # hidden channels of ψ; () = the paper's Table 6
    vtc_seed: int | None = None  # None: derived from the run seed
    save_generator: str = ""  # path for ψ + prototypes + σ after the last aggregation
    oracle: str = ""  # model file of a centrally trained classifier that scores ψ's samples
    oracle_samples: int = 50  # generated samples per class for the oracle and device agreement

    def __post_init__(self):
        weights = {
            "lam": self.lam,
            "tc_weight": self.tc_weight,
            "vtc_lr": self.vtc_lr,
            "sample_sigma_scale": self.sample_sigma_scale,
            "proto_rc_weight": self.proto_rc_weight,
        }
        for name, value in weights.items():
            if not value >= 0:
                raise ValueError(f"{name} must be >= 0")
        if self.align_weight is not None and not self.align_weight >= 0:
            raise ValueError("align_weight must be >= 0 (or none: tc_weight)")
        if self.init_sigma is not None and not self.init_sigma > 0:
            raise ValueError("init_sigma must be > 0 (or none: from the data)")
        if self.oracle_samples < 1:
            raise ValueError("oracle_samples must be >= 1")
        if self.synthetic_samples < 0 or self.finetune_epochs < 0:
            raise ValueError("synthetic_samples and finetune_epochs must be >= 0")
        if self.finetune_lr is not None and self.finetune_lr <= 0:
            raise ValueError("finetune_lr must be > 0")
