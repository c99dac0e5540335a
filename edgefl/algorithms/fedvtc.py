"""FedVTC (Niu, Dong, Qin): prototypes and SD, a variational transposed-convolution decoder,
and a last phase of fine-tuning on synthetic data. Spec: ALGORITHMS.md §4.

Every device model f_k = h_k ∘ g_k exposes a latent z = g_k(x) of one common dimension p
(``model.features``; the zoo's projection to ``feature_dim``) and a linear head h_k
(``model.classifier``). z reshapes to the decoder's input: p / (H/4 · W/4) channels at a quarter
of the image size, i.e. (20, 7, 7) for Fashion-MNIST/MNIST with p = 980, (64, 8, 8) for 32×32
RGB with p = 4096.

Decoder ψ (:class:`VTCDecoder`, the paper's Table 6): four ConvTranspose2d (k3 s1 p1; k4 s2 p1;
k3 s1 p1; k4 s2 p1), each followed by BatchNorm; LeakyReLU(0.01) after the first three, Sigmoid
after the last, so generated images lie in [0, 1] like the inputs. σ_k is a learnable vector in
R^p, parameterised as log σ; v = z + σ ⊙ ε.

Losses (per minibatch; Σ_y mean_{i∈y} is over the classes present in the batch):
    L_rc = ‖ψ(v) − x‖²₂,   KL = ½[(z − c^y)ᵀ(z − c^y) + Σσ_j² − p − Σ log σ_j²]
    L_e  = Σ_y mean_{i∈y}(L_rc + KL),   L_dm = Σ_y mean_{i∈y} ‖g_k(ψ(v_i)) − c^y‖²
    L_tc = L_e + λ·L_dm  (λ = ``lam`` = 0.1; ``lam=0`` is the paper's "L_e only" ablation)

Device, alternating per minibatch: (a) ψ and σ frozen (ψ in eval mode, so not even its BN
statistics move), f_k updated with CE + L_tc; (b) f_k frozen (eval mode), ψ and σ updated with
L_tc — step (b) reuses the batch's z from step (a), detached. After training: prototypes c_k^y
(eval mode, all local data); uplink = prototypes of the held classes + σ_k.

Server: c^y = unweighted mean over the devices that reported y this round (a class nobody
reported keeps its value); σ = unweighted mean. Downlink: the prototypes of the device's classes
+ σ, and the seed every device builds its ψ from (``vtc_seed`` in the metadata; derived from the
run seed, so all ψ_k start equal — what makes the one-shot average meaningful).

After the last round, one closing round (``closing_rounds = 1``) selects every device; its
downlink says ``phase=upload_psi`` and the device uploads ψ_k without training. The server
averages ψ parameter-wise (BN statistics included) and the final downlink carries ψ, all
prototypes and σ. :meth:`FedVTCDevice.finish` draws S/C latents per class from N(c^y, diag σ²),
decodes them with ψ (eval mode) and fine-tunes the whole model with CE for ``finetune_epochs``
epochs at the run's batch size and optimizer, at lr ``finetune_lr`` (default 0.001; none: the
run's lr) — no communication.

Option ``psi_every_round``: the paper's ablation — devices upload ψ_k every round, the server
averages over the round's participants and sends ψ back with the prototypes (no closing round).
The loop counts the bytes either way.

Our choices (the paper leaves them open or they do not fit a CPU; all are options):
- CPU fleet: FedHeNN's five CNNs at width 0.5 (``edgefl simulate -a fedvtc``); the ResNet depth
  family works the same (``--model resnet --tiers 10,14,18,22,26``).
- ``tc_weight`` scales L_tc inside step (a). The paper adds L_tc unscaled; its L_rc sums squared
  errors over all pixels and is summed over the batch's classes, hundreds of times CE, which the
  paper absorbs with SGD lr 1e-4 on MNIST and 100 rounds × 5 epochs. Our CPU runs use SGD lr
  0.01 and few rounds; ``tc_weight`` keeps CE in charge of the classifier there
  (default 0.001; 1.0 is the paper's literal loss). Measured (benchmarks/fedvtc/previous/sweeps/, 20
  devices, 12k Fashion-MNIST images, 20 rounds): 1.0 and 0.1 diverge or stay at chance, 0.01
  trails 0.001 by 5–14 points before fine-tuning, 0.0001 is within a point or two of 0.001.
- ``align_weight`` (default none: ``tc_weight``, the paper's single weight): the weight of KL's
  z-part, ½‖z − c^y‖², in step (a) — the pull of each device's latents onto the global
  prototypes — apart from the rest of L_tc. The decoders can only decode the global prototypes
  if every device's class means sit near them; at tc_weight 0.001 they sit 4.7–6.9 away against a
  within-class spread of 1.7–3.7 (``benchmarks/fedvtc/collapse.py``), and the averaged ψ decodes
  every class to one image. A stronger pull without the reconstruction's scale is the option's
  purpose; its value is not settled yet (benchmarks/fedvtc/SWEEP.md).
- ``vtc_lr`` (default 1e-3, Adam) for ψ and σ: the decoder is trained with Adam so it learns
  in a few CPU rounds; ``vtc_optimizer=same`` uses the run's optimizer and lr.
- Initial prototypes (``init_prototypes``): a class without a global prototype yet uses the
  device's own class mean of z, measured before its first local step (the errata; ``zero`` is the
  earlier default, which pulls the generator towards one point).
- Initial σ (``init_sigma``): the paper initialises σ to 1, against prototype norms of 5–15 in our
  runs. Default ``None``: each device measures the spread of its features around their class mean
  (per dimension, the root mean square of z − c^y over its data) before its first local step and
  starts σ there; σ stays learnable as in the paper, and the server sends none until it has
  averaged the devices' σ. A number sets σ to it everywhere (``init_sigma=1`` is the paper).
- Generation with BN in eval mode, one fine-tuning round = one epoch over D′.
- Run defaults (``FEDVTC_DEFAULTS``): FedProto's CPU fleet (``PROTOTYPE_DEFAULTS``) with two
  local epochs per round (the paper trains E = 5), and ``finetune_lr`` 0.001 (the paper
  fine-tunes at its training lr). Both chosen for issue 17's quick command
  (``edgefl simulate -a fedvtc --clients 4 --rounds 3 --train-samples 3000``) on a validation
  split, two seeds (``benchmarks/fedvtc/quick_defaults.md``): at one epoch the devices sit at
  57 % before the fine-tune and ψ's samples are recognised by the oracle 34 % of the time; the
  fine-tune at the run's lr (0.01, momentum 0.9) lowered the better-trained devices (72 → 55 %)
  more than it raised the weakest (−4.5 points on average at one epoch, −11.8 at two). Two epochs and lr 0.001: 70 % before,
  64.5 % after, against 52.2 % at the old defaults. The fine-tune still costs points after so few
  rounds; with a better ψ (more rounds) it is what adds the classes a device lacks.
- ``sample_sigma_scale`` (not in the paper; default 1.0 = the paper): draws the synthetic latents
  from N(c^y, diag (scale·σ)²). A diagnostic for runs where σ ≈ 1 swamps the distance between
  prototypes (benchmarks/fedvtc/previous/results.md).
- ``oracle``: a model file (``edgefl.models.files.save_model_file``; a classifier trained
  centrally, outside the federation) the server uses to score ψ each time it averages it:
  ``oracle_agreement`` is the share of ``oracle_samples`` generated samples per known class that
  the oracle assigns to the intended class (``oracle_agreement_<c>`` per class). The devices
  report, in the closing round, the same share under their own model for their own ψ_k
  (``synthetic_agreement``; the server's mean is ``device_agreement``).
- ``save_generator``: a path where the server writes ψ, all prototypes and σ after the last
  aggregation (safetensors; :func:`load_generator` reads it back) — for inspection, e.g. the
  benchmark's grid of generated samples.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import safetensors.numpy
import torch
import torch.nn.functional as F
from torch import nn

from edgefl.algorithms.aggregate import weighted_average
from edgefl.algorithms.base import Algorithm, DeviceHalf, MethodNeeds, register
from edgefl.algorithms.fedproto import (
    PROTO,
    PROTO_CLASSES,
    PROTOTYPE_DEFAULTS,
    PrototypeServer,
    PrototypeTable,
    local_prototypes,
    pack_prototypes,
    prototype_specs,
    unpack_prototypes,
)
from edgefl.algorithms.training import local_batches, make_optimizer
from edgefl.errors import ConfigError, EdgeflError
from edgefl.models import ModelSpec
from edgefl.privacy import ClassStats, Release
from edgefl.wire import ArraySpec, Payload, array_spec, arrays_to_state, state_to_arrays

log = logging.getLogger(__name__)

PSI = "psi/"
SIGMA = "sigma"
#: Hidden channels of the paper's Table 6, keyed by the latent's channels.
PAPER_HIDDEN = {20: (16, 32, 32), 64: (32, 64, 64), 128: (64, 64, 64)}


# -- the decoder --------------------------------------------------------------------------------
@dataclass(frozen=True)
class VTCLayout:
    latent: tuple[int, int, int]  # (channels, H/4, W/4)
    hidden: tuple[int, int, int]
    out_channels: int

    @property
    def dim(self) -> int:
        return math.prod(self.latent)


def vtc_layout(spec: ModelSpec, hidden: Sequence[int] = ()) -> VTCLayout:
    """The decoder that maps the spec's latent (``feature_dim``) back to its input shape."""
    channels, height, width = spec.in_shape
    if height % 4 or width % 4:
        raise ConfigError(f"fedvtc's decoder upsamples ×4: image sides must be multiples of 4, got {spec.in_shape}")
    cells = (height // 4) * (width // 4)
    p = spec.feature_dim
    if p is None or p % cells:
        example = 20 * cells if channels == 1 else 64 * cells
        raise ConfigError(
            f"fedvtc needs feature_dim = latent channels × {height // 4}×{width // 4} (e.g. {example}); got {p}"
        )
    c0 = p // cells
    hidden = tuple(hidden) or PAPER_HIDDEN.get(c0, (max(8, c0 // 2), c0, c0))
    if len(hidden) != 3 or min(hidden) < 1:
        raise ConfigError(f"vtc_channels needs three positive channel counts, got {hidden}")
    return VTCLayout((c0, height // 4, width // 4), tuple(int(h) for h in hidden), channels)


class VTCDecoder(nn.Module):
    """ψ: latent [B, p] → images [B, C, H, W] in [0, 1]."""

    def __init__(self, layout: VTCLayout):
        super().__init__()
        self.layout = layout
        c0, (c1, c2, c3), out = layout.latent[0], layout.hidden, layout.out_channels
        self.layers = nn.Sequential(
            nn.ConvTranspose2d(c0, c1, 3, 1, 1), nn.BatchNorm2d(c1), nn.LeakyReLU(0.01),
            nn.ConvTranspose2d(c1, c2, 4, 2, 1), nn.BatchNorm2d(c2), nn.LeakyReLU(0.01),
            nn.ConvTranspose2d(c2, c3, 3, 1, 1), nn.BatchNorm2d(c3), nn.LeakyReLU(0.01),
            nn.ConvTranspose2d(c3, out, 4, 2, 1), nn.BatchNorm2d(out), nn.Sigmoid(),
        )  # fmt: skip

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        return self.layers(v.reshape(v.shape[0], *self.layout.latent))


def build_decoder(layout: VTCLayout, seed: int) -> VTCDecoder:
    """ψ from a seed: every device and the server get identical initial weights."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return VTCDecoder(layout)


def load_decoder(layout: VTCLayout, arrays: Mapping[str, np.ndarray]) -> VTCDecoder:
    """ψ in eval mode from its ``psi/`` arrays (an upload, the server's average, a saved file)."""
    psi = VTCDecoder(layout)
    psi.load_state_dict(arrays_to_state(arrays, PSI), strict=True)
    return psi.eval()


# -- the losses ---------------------------------------------------------------------------------
def kl_to_prototype(z: torch.Tensor, c: torch.Tensor, log_sigma: torch.Tensor) -> torch.Tensor:
    """Per sample: KL(N(z, diag σ²) ‖ N(c, I)) = ½[(z − c)ᵀ(z − c) + Σσ² − p − Σ log σ²]."""
    p = z.shape[1]
    sigma_part = (2 * log_sigma).exp().sum() - p - 2 * log_sigma.sum()
    return 0.5 * (((z - c) ** 2).sum(1) + sigma_part)


def class_mean_sum(values: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Σ_y mean_{i: y_i = y} values_i over the classes present."""
    _, inverse, counts = torch.unique(y, return_inverse=True, return_counts=True)
    sums = torch.zeros(len(counts), dtype=values.dtype).index_add(0, inverse, values)
    return (sums / counts).sum()


@torch.no_grad()
def feature_statistics(model: nn.Module, data, batch_size: int = 256) -> tuple[dict[int, np.ndarray], np.ndarray]:
    """({class: mean of z} as :func:`local_prototypes` gives it, per-dimension root mean square of
    z − c^y) over ``data``, the model in eval mode: the device's own prototypes and the spread of
    its features around them."""
    means = local_prototypes(model, data, batch_size)
    centres = torch.zeros(max(means) + 1, next(iter(means.values())).shape[0], dtype=torch.float64)
    for c, m in means.items():
        centres[c] = torch.from_numpy(m).double()
    was_training = model.training
    model.eval()
    squares, n = 0.0, 0
    for x, y in data.batches(batch_size, shuffle=False):
        squares = squares + ((model.features(x).double() - centres[y]) ** 2).sum(0)
        n += len(y)
    model.train(was_training)
    return means, (squares / max(n, 1)).sqrt().float().numpy()


@dataclass
class TCTerms:
    le: torch.Tensor  # Σ_y mean (L_rc + KL)
    dm: torch.Tensor  # Σ_y mean ‖g(ψ(v)) − c^y‖²
    rc: torch.Tensor  # mean L_rc, for the record
    pull: torch.Tensor  # Σ_y mean ½‖z − c^y‖²: the part of KL that moves the model (in le too)


def tc_terms(
    model: nn.Module,
    psi: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    z: torch.Tensor,
    log_sigma: torch.Tensor,
    protos: torch.Tensor,
    eps: torch.Tensor,
    with_dm: bool = True,
) -> TCTerms:
    """L_e and L_dm of a batch; ``z = g(x)``. L_dm runs the generated samples through the
    device's own extractor ``model.features``."""
    c = protos[y]
    v = z + log_sigma.exp() * eps
    generated = psi(v)
    rc = ((generated - x) ** 2).flatten(1).sum(1)
    le = class_mean_sum(rc + kl_to_prototype(z, c, log_sigma), y)
    dm = class_mean_sum(((model.features(generated) - c) ** 2).sum(1), y) if with_dm else z.new_zeros(())
    pull = class_mean_sum(0.5 * ((z - c) ** 2).sum(1), y)
    return TCTerms(le, dm, rc.mean(), pull)


def _trainable(module_or_params, flag: bool) -> None:
    params = module_or_params.parameters() if isinstance(module_or_params, nn.Module) else module_or_params
    for p in params:
        p.requires_grad_(flag)


@torch.no_grad()
def generate(
    psi: VTCDecoder,
    protos: torch.Tensor,
    sigma: torch.Tensor,
    classes: Sequence[int],
    per_class: int,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``per_class`` samples x' = ψ(v), v ~ N(c^y, diag σ²), for each class; ψ in eval mode."""
    was_training = psi.training
    psi.eval()
    y = torch.tensor(classes, dtype=torch.int64).repeat_interleave(per_class)
    eps = torch.randn(len(y), protos.shape[1], generator=generator)
    x = psi(protos[y] + sigma * eps)
    psi.train(was_training)
    return x, y


# -- options ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FedVTCOptions:
    lam: float = 0.1  # λ of L_dm; 0 = the "L_e only" ablation
    tc_weight: float = 0.001  # weight of L_tc in the model's step (a); 1.0 = the paper's literal loss
    align_weight: float | None = None  # weight of KL's pull of z onto c^y in step (a); None = tc_weight
    # step (b) also decodes v ~ N(c^y, σ²) around the *global* prototype towards the batch's images of
    # class y, so that every ψ_k is trained on the same latent region before they are averaged.
    # Not in the paper, whose ψ_k only see each device's own z (0 = the paper): there the averaged
    # ψ decoded one image for every class (oracle 10 %) and the fine-tune halved accuracy; at 10 the
    # oracle reaches 45–46 % and the fine-tune adds 6–12 points (benchmarks/fedvtc, decoder sweep)
    proto_rc_weight: float = 10.0
    # the averaged ψ's BatchNorm statistics: "average" (the paper: the mean of the uploads' running
    # statistics) or "recalibrate" (re-estimated by the server on latents v ~ N(c^y, diag σ²) of the
    # known classes, the inputs ψ will decode; averaged weights do not produce the averaged statistics)
    psi_bn: Literal["average", "recalibrate"] = "recalibrate"
    vtc_optimizer: Literal["adam", "same"] = "adam"
    vtc_lr: float = 1e-3  # for ψ and σ with vtc_optimizer=adam
    init_sigma: float | None = None  # None: each device's observed spread of z around its class means
    init_prototypes: Literal["local", "zero"] = "local"  # a class without a global prototype yet
    synthetic_samples: int = 500  # S, split evenly over the classes with a prototype
    finetune_epochs: int = 5  # 𝒯
    # None: the run's lr (the paper). 0.001: a tenth of the fleet's SGD lr, so a ψ that is still
    # poor after a few rounds does not undo the real-data training (benchmarks/fedvtc/quick_defaults.md)
    finetune_lr: float | None = 0.001
    sample_sigma_scale: float = 1.0  # generate from N(c^y, diag (scale·σ)²); 1.0 = the paper
    psi_every_round: bool = False  # the paper's per-round TC transmission ablation
    vtc_channels: tuple[int, ...] = ()  # hidden channels of ψ; () = the paper's Table 6
    vtc_seed: int | None = None  # None: derived from the run seed
    save_generator: str = ""  # path for ψ + prototypes + σ after the last aggregation
    oracle: str = ""  # model file of a centrally trained classifier that scores ψ's samples
    oracle_samples: int = 50  # generated samples per class for the oracle and device agreement

    def __post_init__(self):
        for name in ("lam", "tc_weight", "vtc_lr", "sample_sigma_scale", "proto_rc_weight"):
            if not getattr(self, name) >= 0:
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


# -- device -------------------------------------------------------------------------------------
class FedVTCDevice(DeviceHalf):
    def __init__(self, ctx, options: FedVTCOptions):
        super().__init__(ctx, options)
        self.layout = vtc_layout(ctx.spec, options.vtc_channels)
        p = self.layout.dim
        self.psi: VTCDecoder | None = None  # built from the server's seed on the first downlink
        self.log_sigma = nn.Parameter(torch.full((p,), math.log(options.init_sigma or 1.0)))
        self.sigma_set = options.init_sigma is not None  # else measured before the first local step
        self.protos = torch.zeros(ctx.num_classes, p)
        self.known = torch.zeros(ctx.num_classes, dtype=torch.bool)  # a global prototype arrived
        self.phase = "train"
        self.synthetic: tuple[torch.Tensor, torch.Tensor] | None = None  # the last fine-tuning set

    # downlink
    def expected_downlink(self) -> dict[str, ArraySpec]:
        """Each part once the server has it: the global prototypes, σ, and ψ (every round with
        ``psi_every_round``, else in the final downlink)."""
        if not hasattr(self, "_downlink"):
            psi = state_to_arrays(build_decoder(self.layout, 0).state_dict(), PSI)
            self._downlink = {
                **prototype_specs(self.layout.dim),
                SIGMA: array_spec(np.float32, (self.layout.dim,), "sigma"),
                # 0-d tensors (BN's num_batches_tracked): any shape, as the server's check
                **{k: array_spec(v.dtype, v.shape if v.ndim else None, "psi") for k, v in psi.items()},
            }
        return self._downlink

    def receive(self, round: int, payload: Payload) -> None:
        seed = payload.meta.get("vtc_seed")
        if self.psi is None and seed is not None:
            self.psi = build_decoder(self.layout, int(seed))
        self.phase = str(payload.meta.get("phase", "train"))
        for c, v in unpack_prototypes(payload.arrays, self.ctx.num_classes, self.layout.dim).items():
            self.protos[c] = torch.tensor(np.asarray(v), dtype=torch.float32)
            self.known[c] = True
        if SIGMA in payload.arrays:
            sigma = np.asarray(payload.arrays[SIGMA], np.float32)
            if sigma.shape != (self.layout.dim,) or not (sigma > 0).all():
                raise ConfigError(f"sigma must be positive of shape ({self.layout.dim},), got {sigma.shape}")
            with torch.no_grad():
                self.log_sigma.copy_(torch.from_numpy(np.log(sigma)))
            self.sigma_set = True
        state = arrays_to_state(payload.arrays, PSI)
        if state:
            self._need_psi().load_state_dict(state, strict=True)

    def _need_psi(self) -> VTCDecoder:
        if self.psi is None:
            raise EdgeflError("fedvtc: no decoder yet — the server's downlink carries its seed (vtc_seed)")
        return self.psi

    @classmethod
    def privacy_release(cls, options) -> Release:
        return Release(
            stats=ClassStats((PROTO,), reduce="mean", classes=PROTO_CLASSES),
            unprotected=(SIGMA, PSI),
            reason="are trained parameters sent beside the prototypes (σ every round, the decoder ψ after training); "
            "no mechanism here bounds them yet",
        )

    # local work
    def fit(self, round: int) -> Payload:
        psi = self._need_psi()
        meta = {"num_samples": len(self.ctx.train_data)}
        if self.phase == "upload_psi":
            return Payload(state_to_arrays(psi.state_dict(), PSI), {**meta, **self.agreement(round)})
        stats = self.train_round(round)
        arrays = pack_prototypes(local_prototypes(self.model, self.ctx.train_data))
        arrays[SIGMA] = self.log_sigma.detach().exp().numpy().astype(np.float32)
        if self.options.psi_every_round:
            arrays.update(state_to_arrays(psi.state_dict(), PSI))
        return Payload(arrays, {**meta, **stats})

    def initialise_from_data(self) -> None:
        """Before the first local step: local class means for the classes without a global
        prototype (``init_prototypes=local``) and σ from the spread of z around them
        (``init_sigma=None``), both measured with the model in eval mode."""
        data = self.ctx.train_data
        held = sorted(set(np.asarray(data.y).tolist()))
        missing = [c for c in held if not self.known[c]] if self.options.init_prototypes == "local" else []
        if not missing and self.sigma_set:
            return
        means, spread = feature_statistics(self.model, data)
        for c in missing:
            self.protos[c] = torch.from_numpy(means[c])
        if not self.sigma_set:
            with torch.no_grad():
                self.log_sigma.copy_(torch.from_numpy(np.log(np.maximum(spread, 1e-3))).float())
            self.sigma_set = True

    @torch.no_grad()
    def agreement(self, round: int) -> dict[str, float]:
        """``synthetic_agreement``: the share of ψ_k's samples (``oracle_samples`` per known
        class, from the global prototypes and σ) that this device's own model assigns to the
        intended class."""
        classes = torch.nonzero(self.known).flatten().tolist()
        if not classes or self.psi is None:
            return {}
        noise = torch.Generator().manual_seed(int(self.ctx.rng(round, 4).integers(2**31)))
        x, y = generate(self.psi, self.protos, self.log_sigma.exp(), classes, self.options.oracle_samples, noise)
        was_training = self.model.training
        self.model.eval()
        share = float((self.model(x).argmax(1) == y).float().mean())
        self.model.train(was_training)
        return {"synthetic_agreement": share}

    def vtc_optimizer(self, round: int) -> torch.optim.Optimizer:
        params = [*self._need_psi().parameters(), self.log_sigma]
        if self.options.vtc_optimizer == "adam":
            return torch.optim.Adam(params, lr=self.options.vtc_lr)
        return make_optimizer(params, self.ctx.settings, round)

    def step_model(self, x: torch.Tensor, y: torch.Tensor, opt: torch.optim.Optimizer, noise: torch.Generator):
        """(a) Update f_k with CE + tc_weight·L_tc; ψ and σ frozen (ψ in eval mode, so its BN
        statistics do not move either). Returns (loss, CE, z of the batch before the step)."""
        model, psi, o = self.model, self._need_psi(), self.options
        _trainable(psi, False)
        self.log_sigma.requires_grad_(False)
        _trainable(model, True)
        model.train()
        psi.eval()
        try:
            z = model.features(x)
            ce = F.cross_entropy(model.classify(z), y)
            eps = torch.randn(z.shape, generator=noise)
            terms = tc_terms(model, psi, x, y, z, self.log_sigma, self.protos, eps, o.lam > 0)
            # align_weight replaces tc_weight on the pull of z onto c^y (KL's z-part); None: the same
            align = o.tc_weight if o.align_weight is None else o.align_weight
            loss = ce + o.tc_weight * (terms.le - terms.pull + o.lam * terms.dm) + align * terms.pull
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        finally:
            _trainable(psi, True)
            self.log_sigma.requires_grad_(True)
        return loss.detach(), ce.detach(), z.detach()

    def step_vtc(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor, opt: torch.optim.Optimizer, noise: torch.Generator) -> TCTerms:
        """(b) Update ψ and σ with L_tc; f_k frozen (eval mode: no BN statistics, no dropout).
        ``z`` is the batch's latent from step (a)."""
        model, psi, o = self.model, self._need_psi(), self.options
        _trainable(model, False)
        model.eval()
        psi.train()
        try:
            eps = torch.randn(z.shape, generator=noise)
            terms = tc_terms(model, psi, x, y, z.detach(), self.log_sigma, self.protos, eps, o.lam > 0)
            loss = terms.le + o.lam * terms.dm
            if o.proto_rc_weight > 0:
                v = self.protos[y] + self.log_sigma.exp() * torch.randn(z.shape, generator=noise)
                loss = loss + o.proto_rc_weight * class_mean_sum(((psi(v) - x) ** 2).flatten(1).sum(1), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        finally:
            _trainable(model, True)
            model.train()
        return terms

    def train_round(self, round: int) -> dict[str, float]:
        """One round of local work, alternating (a) and (b) on every minibatch."""
        self.initialise_from_data()
        opt_f = make_optimizer(self.model.parameters(), self.ctx.settings, round)
        opt_v = self.vtc_optimizer(round)
        noise = torch.Generator().manual_seed(int(self.ctx.rng(round, 1).integers(2**31)))
        totals = {"train_loss": 0.0, "ce": 0.0, "l_e": 0.0, "l_dm": 0.0, "l_rc": 0.0}
        seen = 0
        for x, y in local_batches(self.ctx.train_data, self.ctx.settings, self.ctx.rng(round)):
            loss, ce, z = self.step_model(x, y, opt_f, noise)
            b = self.step_vtc(x, y, z, opt_v, noise)
            seen += len(y)
            for key, value in (("train_loss", loss), ("ce", ce), ("l_e", b.le), ("l_dm", b.dm), ("l_rc", b.rc)):
                totals[key] += float(value.detach()) * len(y)
        stats = {k: v / max(seen, 1) for k, v in totals.items()}
        stats["sigma_mean"] = float(self.log_sigma.detach().exp().mean())
        stats["samples_seen"] = float(seen)
        return stats

    # the end: synthetic fine-tuning
    def finish(self, round: int, payload: Payload) -> None:
        self.receive(round, payload)
        classes = torch.nonzero(self.known).flatten().tolist()
        per_class = self.options.synthetic_samples // max(self.ctx.num_classes, 1)
        if not classes or per_class == 0 or self.options.finetune_epochs == 0:
            return
        noise = torch.Generator().manual_seed(int(self.ctx.rng(round, 2).integers(2**31)))
        sigma = self.log_sigma.detach().exp() * self.options.sample_sigma_scale
        x, y = generate(self._need_psi(), self.protos, sigma, classes, per_class, noise)
        self.synthetic = (x, y)
        self.finetune(x, y, round)

    def finetune(self, x: torch.Tensor, y: torch.Tensor, round: int) -> None:
        settings = self.ctx.settings
        if self.options.finetune_lr is not None:
            settings = dataclasses.replace(settings, lr=self.options.finetune_lr, lr_decay_rounds=())
        opt = make_optimizer(self.model.parameters(), settings, round)
        order_rng = self.ctx.rng(round, 3)
        self.model.train()
        for _ in range(self.options.finetune_epochs):
            order = torch.from_numpy(order_rng.permutation(len(y)))
            for start in range(0, len(y), settings.batch_size):
                rows = order[start : start + settings.batch_size]
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(self.model(x[rows]), y[rows]).backward()
                opt.step()


# -- server -------------------------------------------------------------------------------------
class FedVTCServer(PrototypeServer):
    method = "fedvtc"

    def __init__(self, ctx, options: FedVTCOptions):
        super().__init__(ctx, options)
        shapes = {s.in_shape for s in ctx.specs()}
        if len(shapes) != 1:
            raise ConfigError(f"fedvtc averages one decoder: every model needs the same input shape (got {sorted(shapes)})")
        self.layout = vtc_layout(ctx.specs()[0], options.vtc_channels)
        if options.vtc_seed is not None:
            self.vtc_seed = int(options.vtc_seed)
        else:
            self.vtc_seed = int(np.random.default_rng([ctx.seed, 0x7C]).integers(2**31))
        # None until the devices' σ is averaged when they measure it from their data
        self.sigma = None if options.init_sigma is None else np.full(self.layout.dim, options.init_sigma, np.float32)
        self.oracle = load_oracle(options.oracle, ctx.specs()[0], ctx.num_classes) if options.oracle else None
        reference = state_to_arrays(build_decoder(self.layout, self.vtc_seed).state_dict(), PSI)
        self.psi_shapes = {k: (v.shape, v.dtype) for k, v in reference.items()}
        self.psi: dict[str, np.ndarray] | None = reference if options.psi_every_round else None

    @property
    def final_round(self) -> int:
        return self.ctx.rounds + self.ctx.closing_rounds

    def select(self, round: int, device_ids: Sequence[str], rng: np.random.Generator) -> list[str]:
        if round >= self.ctx.rounds:  # the closing round: every device uploads ψ_k
            return sorted(device_ids)
        return super().select(round, device_ids, rng)

    def expected_uplink(self, device_id: str) -> dict[str, ArraySpec]:
        # 0-d tensors (BN's num_batches_tracked) may arrive as [1]: any shape, sizes checked later
        psi = {k: array_spec(dt, s if len(s) else None) for k, (s, dt) in self.psi_shapes.items()}
        if self.ctx.round >= self.ctx.rounds:  # the loop's round in progress
            return psi
        train = {**super().expected_uplink(device_id), SIGMA: array_spec(np.float32, (self.layout.dim,))}
        return {**train, **psi} if self.options.psi_every_round else train

    def downlink(self, round: int, device_id: str) -> Payload:
        meta = {"vtc_seed": self.vtc_seed}
        if round >= self.final_round:
            arrays = {**pack_prototypes(self.table.select(None)), **self.sigma_arrays(), **(self.psi or {})}
            return Payload(arrays, {**meta, "phase": "final"})
        if round >= self.ctx.rounds:
            return Payload({}, {**meta, "phase": "upload_psi"})
        arrays = {**self.prototype_downlink(device_id), **self.sigma_arrays()}
        if self.options.psi_every_round:
            arrays.update(self.psi)
        return Payload(arrays, {**meta, "phase": "train"})

    def sigma_arrays(self) -> dict[str, np.ndarray]:
        return {} if self.sigma is None else {SIGMA: self.sigma.copy()}

    def valid_psi(self, device_id: str, payload: Payload) -> dict[str, np.ndarray] | None:
        arrays = {k: v for k, v in payload.arrays.items() if k.startswith(PSI)}
        # sizes, not shapes: the wire carries 0-d tensors (BN's num_batches_tracked) as [1]
        sizes = {k: (v.size, v.dtype) for k, v in arrays.items()}
        if sizes != {k: (math.prod(s), dt) for k, (s, dt) in self.psi_shapes.items()}:
            log.warning("fedvtc: ignoring the decoder from %s: its tensors do not match the fleet's decoder", device_id)
            return None
        return {k: v.reshape(self.psi_shapes[k][0]) for k, v in arrays.items()}

    def average_psi(self, uplinks: Mapping[str, Payload]) -> int:
        """ψ = parameter-wise unweighted mean of the valid uploads; returns how many were used."""
        valid = [a for d, p in uplinks.items() if (a := self.valid_psi(d, p)) is not None]
        if valid:
            self.psi = weighted_average((a, 1.0) for a in valid)
            if self.options.psi_bn == "recalibrate":
                self.psi = self.recalibrated_psi(self.psi)
        return len(valid)

    @torch.no_grad()
    def recalibrated_psi(self, arrays: Mapping[str, np.ndarray], batches: int = 20, per_class: int = 20) -> dict[str, np.ndarray]:
        """``arrays`` with ψ's BatchNorm running statistics re-estimated on ``batches`` batches of
        latents v ~ N(c^y, diag σ²), ``per_class`` per known class (a cumulative average)."""
        if self.sigma is None or not self.table.known.any():
            return dict(arrays)
        psi = load_decoder(self.layout, arrays)
        for m in psi.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.reset_running_stats()
                m.momentum = None  # the plain mean over the batches
        psi.train()
        classes = np.flatnonzero(self.table.known).tolist()
        noise = torch.Generator().manual_seed(int(self.ctx.rng(self.ctx.round, 6).integers(2**31)))
        protos, sigma = torch.from_numpy(self.table.values.astype(np.float32)), torch.from_numpy(self.sigma)
        y = torch.tensor(classes, dtype=torch.int64).repeat_interleave(per_class)
        for _ in range(batches):
            psi(protos[y] + sigma * torch.randn(len(y), protos.shape[1], generator=noise))
        return state_to_arrays(psi.state_dict(), PSI)

    def aggregate(self, round: int, uplinks: Mapping[str, Payload]) -> dict[str, float]:
        if round >= self.ctx.rounds:
            metrics = {"psi_uploads": float(self.average_psi(uplinks)), **self.oracle_metrics(round)}
            agreements = [float(p.meta["synthetic_agreement"]) for p in uplinks.values()
                          if isinstance(p.meta.get("synthetic_agreement"), (int, float))]
            if agreements:
                metrics["device_agreement"] = float(np.mean(agreements))
            self._save_generator()
            return metrics
        metrics = self.aggregate_prototypes(uplinks)
        sigmas = [
            np.asarray(p.arrays[SIGMA], np.float64)
            for p in uplinks.values()
            if SIGMA in p.arrays and p.arrays[SIGMA].shape == (self.layout.dim,) and (p.arrays[SIGMA] > 0).all()
        ]
        if sigmas:
            self.sigma = np.mean(sigmas, axis=0).astype(np.float32)
        if self.sigma is not None:
            metrics["sigma_mean"] = float(self.sigma.mean())
        if self.options.psi_every_round:
            metrics["psi_uploads"] = float(self.average_psi(uplinks))
            metrics.update(self.oracle_metrics(round))
            if round == self.ctx.rounds - 1:
                self._save_generator()
        return metrics

    @torch.no_grad()
    def oracle_metrics(self, round: int) -> dict[str, float]:
        """The oracle's verdict on the averaged ψ: per known class, the share of
        ``oracle_samples`` samples ψ(v), v ~ N(c^y, diag σ²), it assigns to y; and their mean."""
        if self.oracle is None or self.psi is None or self.sigma is None or not self.table.known.any():
            return {}
        psi = load_decoder(self.layout, self.psi)
        classes = np.flatnonzero(self.table.known).tolist()
        noise = torch.Generator().manual_seed(int(self.ctx.rng(round, 5).integers(2**31)))
        per = self.options.oracle_samples
        x, y = generate(psi, torch.from_numpy(self.table.values.astype(np.float32)), torch.from_numpy(self.sigma),
                        classes, per, noise)
        hit = (self.oracle(x).argmax(1) == y).float().reshape(len(classes), per).mean(1)
        out = {f"oracle_agreement_{c}": float(h) for c, h in zip(classes, hit, strict=True)}
        out["oracle_agreement"] = float(hit.mean())
        return out

    def _save_generator(self) -> None:
        path = self.options.save_generator
        if not path or self.psi is None or self.sigma is None:
            return
        save_generator(path, self.layout, self.psi, self.table, self.sigma)

    def state_dict(self) -> dict[str, np.ndarray]:
        return {**super().state_dict(), **self.sigma_arrays(), **(self.psi or {})}

    def load_state_dict(self, arrays: Mapping[str, np.ndarray]) -> None:
        super().load_state_dict(arrays)
        if SIGMA in arrays:
            self.sigma = np.array(arrays[SIGMA], np.float32)
        psi = {k: np.array(v) for k, v in arrays.items() if k.startswith(PSI)}
        if psi:
            self.psi = psi


def load_oracle(path: str | Path, spec: ModelSpec, num_classes: int) -> nn.Module:
    """The oracle classifier from a local model file (safetensors; never a pickle), checked to
    take the fleet's input and to predict its classes."""
    from edgefl.errors import ModelFileError
    from edgefl.models.files import load_model_file

    try:
        model = load_model_file(path)
    except ModelFileError as e:
        raise ConfigError(f"fedvtc option oracle: {e}") from None
    if tuple(model.spec.in_shape) != tuple(spec.in_shape) or model.spec.num_classes != num_classes:
        raise ConfigError(f"fedvtc option oracle: {path} takes {model.spec.in_shape} and predicts "
                          f"{model.spec.num_classes} classes; the fleet's models take {spec.in_shape} with {num_classes}")
    return model.eval()


# -- the saved generator --------------------------------------------------------------------------
def save_generator(path: str | Path, layout: VTCLayout, psi: Mapping[str, np.ndarray], table: PrototypeTable, sigma: np.ndarray) -> None:
    """ψ, all prototypes (with the mask of known classes) and σ, as one safetensors file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {**{k: np.ascontiguousarray(v) for k, v in psi.items()}, **table.state(), SIGMA: np.ascontiguousarray(sigma)}
    meta = {"layout": json.dumps(dataclasses.asdict(layout))}
    safetensors.numpy.save_file(arrays, str(path), metadata=meta)


def load_generator(path: str | Path) -> tuple[VTCDecoder, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ψ in eval mode, prototypes [C, p], known-class mask [C], σ [p]) from :func:`save_generator`."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        raw = json.loads(f.metadata()["layout"])
    layout = VTCLayout(tuple(raw["latent"]), tuple(raw["hidden"]), int(raw["out_channels"]))
    arrays = safetensors.numpy.load_file(str(path))
    psi = load_decoder(layout, arrays)
    table = PrototypeTable(len(arrays["table/known"]), layout.dim)
    table.load(arrays)
    return psi, torch.from_numpy(table.values), torch.from_numpy(table.known), torch.from_numpy(arrays[SIGMA])


#: FedProto's CPU fleet with two local epochs per round: at one, the 3-round quick command's
#: devices train 1–2 epochs in all (benchmarks/fedvtc/quick_defaults.md). FedProto keeps one.
FEDVTC_DEFAULTS = {**PROTOTYPE_DEFAULTS, "epochs": 2}

register(
    Algorithm(
        name="fedvtc",
        description="FedVTC: prototypes + SD, a variational transposed-convolution decoder, synthetic fine-tuning",
        device=FedVTCDevice,
        server=FedVTCServer,
        options=FedVTCOptions,
        defaults=FEDVTC_DEFAULTS,
        # the one-shot ψ upload after training (none when ψ travels every round); the finish is the
        # synthetic fine-tune
        needs=lambda o: MethodNeeds(closing_rounds=0 if o.psi_every_round else 1, finish_trains=True),
    )
)
