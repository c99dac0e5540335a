"""Velo's server-side conditional VAE over per-class features (Chan & Ngai; sizes from their code).

    emb = Embedding(C, 512), shared by encoder and decoder
    encoder: [s; emb(y)] → Linear(d+512, d) → BatchNorm1d → ReLU → Linear(d, 2d) → (μ, log σ²)
    decoder: [z; emb(y)] → Linear(d+512, d) → Linear(d, d)          (no activation, as the code)
    loss:    MSE_mean(ŝ, s) − ½·Σ(1 + log σ² − μ² − σ²)              (KL summed over batch and dims)

The latent has d dimensions. Training re-creates Adam every call (as the authors' code); generation
decodes z ~ N(0, I) for the requested labels. The whole state (weights and BatchNorm statistics)
converts to numpy arrays, so a server checkpoint holding it needs no pickle.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

EMBED_DIM = 512


class CVAE(nn.Module):
    def __init__(self, num_classes: int, feature_dim: int, embed_dim: int = EMBED_DIM):
        super().__init__()
        d = feature_dim
        self.num_classes, self.feature_dim = num_classes, feature_dim
        self.embedding = nn.Embedding(num_classes, embed_dim)
        self.encoder = nn.Sequential(
            nn.Linear(d + embed_dim, d), nn.BatchNorm1d(d), nn.ReLU(), nn.Linear(d, 2 * d)
        )
        self.decoder = nn.Sequential(nn.Linear(d + embed_dim, d), nn.Linear(d, d))

    def encode(self, s: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        mu, logvar = self.encoder(torch.cat([s, self.embedding(y)], 1)).chunk(2, dim=1)
        return mu, logvar

    def decode(self, z: Tensor, y: Tensor) -> Tensor:
        return self.decoder(torch.cat([z, self.embedding(y)], 1))

    def forward(self, s: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        mu, logvar = self.encode(s, y)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return self.decode(z, y), mu, logvar


def cvae_loss(recon: Tensor, s: Tensor, mu: Tensor, logvar: Tensor) -> Tensor:
    """Reconstruction MSE (mean) plus the KL to N(0, I) summed over batch and dims (the code's)."""
    kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return F.mse_loss(recon, s) + kl


@contextmanager
def one_thread() -> Iterator[None]:
    """Torch at one intra-op thread inside the block, the caller's count restored after it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@one_thread()
def train_cvae(
    model: CVAE,
    features: np.ndarray,
    labels: np.ndarray,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    seed: int,
) -> list[float]:
    """``epochs`` shuffled passes over (features, labels); returns the mean loss of each epoch.

    Runs at one torch thread (:func:`one_thread` as a decorator: each call sets and restores
    it): its steps are 50 × (d + 512) matrices, too small to split, and a second thread only
    adds its hand-offs (5,000 points, 10 epochs, d = 64, on 2 cores with OMP_WAIT_POLICY=PASSIVE
    as the ``edgefl`` command sets it: 4.0 s at one thread, 7.4 s at two)."""
    n = len(labels)
    if n == 0:
        return []
    s_all = torch.as_tensor(np.asarray(features, np.float32))
    y_all = torch.as_tensor(np.asarray(labels, np.int64))
    # fused: one kernel updates all the CVAE's tensors, where the default CPU loop visits them one
    # by one; the same update rule. Its thousands of tiny steps are bound by per-tensor overhead: 10
    # epochs over 5,000 points took 2.7-3.5 s fused against 3.3-5.1 s with foreach kernels (which
    # had cut 39 % off the loop, benchmarks/scale/parallel.md), alternating on 2 cores, the same
    # final loss.
    opt = torch.optim.Adam(model.parameters(), lr=lr, fused=True)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    model.train()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        for _ in range(epochs):
            order = torch.randperm(n, generator=gen)
            total, seen = 0.0, 0
            for start in range(0, n, batch_size):
                idx = order[start : start + batch_size]
                if len(idx) < 2:  # BatchNorm1d needs two samples in train mode
                    continue
                recon, mu, logvar = model(s_all[idx], y_all[idx])
                loss = cvae_loss(recon, s_all[idx], mu, logvar)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                total += float(loss.detach()) * len(idx)
                seen += len(idx)
            if seen:
                losses.append(total / seen)
    return losses


@torch.no_grad()
def generate(model: CVAE, labels: np.ndarray, seed: int) -> np.ndarray:
    """One synthetic feature per label: decode(z ~ N(0, I), y) with a seeded z."""
    y = torch.as_tensor(np.asarray(labels, np.int64))
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(len(y), model.feature_dim, generator=gen)
    was_training = model.training
    model.eval()
    out = model.decode(z, y).numpy().astype(np.float32)
    model.train(was_training)
    return out


def cvae_arrays(model: CVAE, prefix: str) -> dict[str, np.ndarray]:
    return {prefix + k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def load_cvae_arrays(model: CVAE, arrays: Mapping[str, np.ndarray], prefix: str) -> bool:
    """Load the arrays under ``prefix``; False (model untouched) when there are none."""
    state = {
        k[len(prefix) :]: torch.as_tensor(np.array(v))
        for k, v in arrays.items()
        if k.startswith(prefix)
    }
    if not state:
        return False
    model.load_state_dict(state, strict=True)
    return True


def conditional_fit(
    model: CVAE,
    features: np.ndarray,
    labels: np.ndarray,
    *,
    per_class: int = 50,
    seed: int = 0,
    steps: int = 200,
) -> tuple[float, float, float]:
    """How well the CVAE's samples carry their class: a softmax classifier is fitted on the real
    feature points (the CVAE's training data); returns (its accuracy on ``per_class`` generated
    features per class that has data, its accuracy on the real points — the ceiling, and the
    spread of the generated features around their class mean relative to the real points' — near 0
    means the CVAE collapsed onto one point per class, which makes Velo's target Felo's mean)."""
    classes = np.unique(labels)
    if len(classes) < 2:
        return float("nan"), float("nan"), float("nan")
    x = torch.as_tensor(np.asarray(features, np.float32))
    y = torch.as_tensor(np.asarray(labels, np.int64))
    mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
    gen = torch.Generator().manual_seed(seed)
    clf = nn.Linear(x.shape[1], model.num_classes)
    with torch.no_grad():
        clf.weight.normal_(0, 0.01, generator=gen)
        clf.bias.zero_()
    opt = torch.optim.LBFGS(clf.parameters(), lr=0.5, max_iter=steps, line_search_fn="strong_wolfe")
    xn = (x - mean) / std

    def closure() -> Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(clf(xn), y) + 1e-4 * clf.weight.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    want = np.repeat(classes, per_class)
    fake = torch.as_tensor(generate(model, want, seed + 1))
    with torch.no_grad():
        fit = float((clf((fake - mean) / std).argmax(1) == torch.as_tensor(want)).float().mean())
        real = float((clf(xn).argmax(1) == y).float().mean())
    ratios = []
    for c in classes:
        pts, gen = x[y == int(c)], fake[torch.as_tensor(want) == int(c)]
        real_spread = float((pts - pts.mean(0)).norm(dim=1).mean())
        if len(pts) > 1 and real_spread > 0:
            ratios.append(float((gen - pts.mean(0)).norm(dim=1).mean()) / real_spread)
    return fit, real, float(np.mean(ratios)) if ratios else float("nan")
