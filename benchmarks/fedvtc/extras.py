"""The hook every FedVTC cell runs (``record_extras="benchmarks.fedvtc.extras:extras"``).

Apart from the grid and the page (:mod:`benchmarks.fedvtc`), so that the cells' code hash
(:mod:`benchmarks.provenance`) covers what a cell runs, not the page's text; it must not import
the benchmark's package.
"""

from __future__ import annotations

import base64
from typing import Any

from benchmarks.cells import RunOutput


def extras(run: RunOutput) -> dict[str, Any]:
    """``accuracy_before_finetune``: the evaluation after the last training round (before the
    closing round and the fine-tune; on the same images as the final one, since the profile's
    eval_samples equal its test_samples); ``bytes_per_device``: every byte up and down per device,
    all rounds, the closing round and the final broadcast included; ``oracle_*`` / ``*agreement*``:
    the last value of any such server metric: ``oracle_agreement`` (and ``oracle_agreement_<c>``
    per class), the oracle's verdict on the averaged ψ, and ``device_agreement``, the devices' own
    models on their own ψ_k, both from the closing round (every round with ψ every round)."""
    cfg, rounds = run.config, run.rounds
    before = next(
        (r["eval"]["mean_accuracy"] for r in rounds if r["round"] == cfg.rounds and "eval" in r),
        None,
    )
    total = (
        sum(r["bytes_up_total"] + r["bytes_down_total"] for r in rounds)
        + run.summary["finish_bytes_down"]
    )
    out: dict[str, Any] = {"accuracy_before_finetune": before,
                           "bytes_per_device": total / max(len(run.summary["client_accuracy"]), 1)}
    for r in rounds:
        for k, v in (r.get("server") or {}).items():
            if (k.startswith("oracle") or "agreement" in k) and isinstance(v, (int, float)):
                out[k] = v
    if (
        run.cell.method == "fedvtc"
        and run.cell.role == "grid"
        and run.cell.seed == 0
        and run.server is not None
    ):
        out["samples"] = sample_images(run.server)
    return out


SAMPLES_PER_CLASS = 8


def sample_images(server, per_class: int = SAMPLES_PER_CLASS) -> dict[str, Any]:
    """``per_class`` samples ψ(v), v ~ N(c^y, diag σ²), of every known class from the server's
    final ψ, prototypes and σ (a fixed generator seed), each scaled to 0–255 on its own, as
    base64 uint8 [classes, per_class, H, W] (the grid figure is drawn from it at report time)."""
    import numpy as np
    import torch

    from edgefl.algorithms.fedvtc import generate, load_decoder

    if server.psi is None or server.sigma is None:
        return {}
    classes = np.flatnonzero(server.table.known).tolist()
    x, _ = generate(
        load_decoder(server.layout, server.psi),
        torch.from_numpy(server.table.values.astype(np.float32)),
        torch.from_numpy(server.sigma),
        classes,
        per_class,
        torch.Generator().manual_seed(0),
    )
    x = x[:, 0].numpy()  # one channel
    lo, hi = x.min(axis=(1, 2), keepdims=True), x.max(axis=(1, 2), keepdims=True)
    img = np.round(255 * (x - lo) / np.maximum(hi - lo, 1e-8)).astype(np.uint8)
    img = img.reshape(len(classes), per_class, *img.shape[1:])
    return {
        "classes": classes,
        "shape": list(img.shape),
        "uint8_base64": base64.b64encode(img.tobytes()).decode(),
    }
