"""FedVTC's variational transposed convolution (:mod:`edgefl.algorithms.fedvtc`): the decoder ψ,
the losses L_e and L_dm, generation from N(c^y, diag σ²), and ψ's saved file. The derivation:
docs/methods/fedvtc.md."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import safetensors.numpy
import torch
from torch import nn

from edgefl.algorithms.fedproto import PrototypeTable, local_prototypes
from edgefl.errors import ConfigError
from edgefl.models import ModelSpec
from edgefl.wire import arrays_to_state

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
        raise ConfigError(
            "fedvtc's decoder upsamples ×4: image sides must be multiples of 4, "
            f"got {spec.in_shape}"
        )
    cells = (height // 4) * (width // 4)
    p = spec.feature_dim
    if p is None or p % cells:
        example = 20 * cells if channels == 1 else 64 * cells
        raise ConfigError(
            f"fedvtc needs feature_dim = latent channels × {height // 4}×{width // 4} "
            f"(e.g. {example}); got {p}"
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
    sums = torch.zeros(len(counts), dtype=values.dtype, device=values.device)
    sums = sums.index_add(0, inverse, values)
    return (sums / counts).sum()


@torch.no_grad()
def feature_statistics(
    model: nn.Module, data, batch_size: int = 256
) -> tuple[dict[int, np.ndarray], np.ndarray]:
    """({class: mean of z} as :func:`local_prototypes` gives it, per-dimension root mean square of
    z − c^y) over ``data``, the model in eval mode: the device's own prototypes and the spread of
    its features around them."""
    means = local_prototypes(model, data, batch_size)
    device = next(model.parameters()).device
    dim = next(iter(means.values())).shape[0]
    centres = torch.zeros(max(means) + 1, dim, dtype=torch.float64, device=device)
    for c, m in means.items():
        centres[c] = torch.from_numpy(m).double().to(device)
    was_training = model.training
    model.eval()
    squares, n = 0.0, 0
    for x, y in data.batches(batch_size, shuffle=False):
        squares = squares + ((model.features(x).double() - centres[y]) ** 2).sum(0)
        n += len(y)
    model.train(was_training)
    return means, (squares / max(n, 1)).sqrt().float().cpu().numpy()


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
    dm = (
        class_mean_sum(((model.features(generated) - c) ** 2).sum(1), y)
        if with_dm
        else z.new_zeros(())
    )
    pull = class_mean_sum(0.5 * ((z - c) ** 2).sum(1), y)
    return TCTerms(le, dm, rc.mean(), pull)


def trainable(module_or_params, flag: bool) -> None:
    params = (
        module_or_params.parameters()
        if isinstance(module_or_params, nn.Module)
        else module_or_params
    )
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
    y = torch.tensor(classes, dtype=torch.int64).repeat_interleave(per_class).to(protos.device)
    # drawn on the CPU (its generator's device): the same draws wherever ψ runs
    eps = torch.randn(len(y), protos.shape[1], generator=generator).to(protos.device)
    x = psi(protos[y] + sigma * eps)
    psi.train(was_training)
    return x, y


# -- the saved generator --------------------------------------------------------------------------
def save_generator(
    path: str | Path,
    layout: VTCLayout,
    psi: Mapping[str, np.ndarray],
    table: PrototypeTable,
    sigma: np.ndarray,
) -> None:
    """ψ, all prototypes (with the mask of known classes) and σ, as one safetensors file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {
        **{k: np.ascontiguousarray(v) for k, v in psi.items()},
        **table.state(),
        SIGMA: np.ascontiguousarray(sigma),
    }
    meta = {"layout": json.dumps(dataclasses.asdict(layout))}
    safetensors.numpy.save_file(arrays, str(path), metadata=meta)


def load_generator(path: str | Path) -> tuple[VTCDecoder, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ψ in eval mode, prototypes [C, p], known-class mask [C], σ [p]) from
    :func:`save_generator`."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        raw = json.loads(f.metadata()["layout"])
    layout = VTCLayout(tuple(raw["latent"]), tuple(raw["hidden"]), int(raw["out_channels"]))
    arrays = safetensors.numpy.load_file(str(path))
    psi = load_decoder(layout, arrays)
    table = PrototypeTable(len(arrays["table/known"]), layout.dim)
    table.load(arrays)
    return (
        psi,
        torch.from_numpy(table.values),
        torch.from_numpy(table.known),
        torch.from_numpy(arrays[SIGMA]),
    )
