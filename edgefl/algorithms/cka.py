"""Centered kernel alignment (Kornblith et al., 2019), differentiable, for FedHeNN.

    K = Z·Zᵀ (linear) or exp(−‖zᵢ − zⱼ‖² / (2·s²·median²)) (RBF),   H = I − 11ᵀ/N
    HSIC(K, L) = Σ (HKH ∘ HLH)
    CKA(K, L)  = HSIC(K, L) / √(HSIC(K, K)·HSIC(L, L))

Kernels are N×N over the same N inputs, so representations of any widths d compare. CKA is
invariant to orthogonal transforms and isotropic scaling of Z, and to positive scaling of K —
which is why a server may normalise an averaged kernel before sending it as float16.
"""

from __future__ import annotations

import torch

EPS = 1e-12


def center(k: torch.Tensor) -> torch.Tensor:
    """H·K·H without forming H: subtract row and column means, add back the grand mean."""
    return k - k.mean(0, keepdim=True) - k.mean(1, keepdim=True) + k.mean()


def linear_kernel(z: torch.Tensor) -> torch.Tensor:
    return z @ z.T


def rbf_kernel(z: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Kornblith's RBF kernel; the bandwidth (median squared distance, diagonal included, as in
    their reference code) is treated as a constant for the gradient."""
    sq_norms = (z * z).sum(1)
    sq = (sq_norms[:, None] + sq_norms[None, :] - 2 * (z @ z.T)).clamp_min(0)
    median = sq.detach().median().clamp_min(EPS)
    return torch.exp(-sq / (2 * scale**2 * median))


def kernel(z: torch.Tensor, kind: str = "linear", scale: float = 1.0) -> torch.Tensor:
    """The N×N kernel of representations z [N, d]."""
    z = z.flatten(1)
    if kind == "linear":
        return linear_kernel(z)
    if kind == "rbf":
        return rbf_kernel(z, scale)
    raise ValueError(f"unknown kernel {kind!r}; choose linear or rbf")


def hsic(k: torch.Tensor, l: torch.Tensor) -> torch.Tensor:  # noqa: E741 - the paper's name
    return (center(k) * center(l)).sum()


def cka(k: torch.Tensor, l: torch.Tensor) -> torch.Tensor:  # noqa: E741
    """CKA of two N×N kernels, in [0, 1] for positive semi-definite kernels."""
    return hsic(k, l) / torch.sqrt((hsic(k, k) * hsic(l, l)).clamp_min(EPS))


class KernelTarget:
    """A fixed kernel L prepared once (centred, self-HSIC) for repeated CKA(K(z), L) calls."""

    def __init__(self, l: torch.Tensor, kind: str = "linear", scale: float = 1.0):  # noqa: E741
        self.lc = center(l.to(torch.float32))
        self.ll = (self.lc * self.lc).sum()
        self.kind, self.scale = kind, scale

    def cka(self, z: torch.Tensor) -> torch.Tensor:
        kc = center(kernel(z, self.kind, self.scale))
        return (kc * self.lc).sum() / torch.sqrt(((kc * kc).sum() * self.ll).clamp_min(EPS))
