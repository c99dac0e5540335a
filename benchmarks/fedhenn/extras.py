"""The hook every FedHeNN cell runs (``record_extras="benchmarks.fedhenn.extras:extras"``): each
device's accuracy on its *local* test split, the paper's metric.

Apart from the grid and the page (:mod:`benchmarks.fedhenn`), so that the cells' code hash
(:mod:`benchmarks.provenance`) covers what a cell runs, not the page's text; it must not import
the benchmark's package.
"""

from __future__ import annotations

import json
import statistics
from typing import Any

from benchmarks.cells import RunOutput


def local_split_accuracy(model, data, class_counts) -> float:
    """Σ_c p_d(c)·acc_d(c): per-class accuracy on ``data`` weighted by the device's training label
    distribution (the device's local test split, as the paper evaluates)."""
    import numpy as np
    import torch

    with torch.no_grad():
        preds = torch.cat(
            [model(x).argmax(1) for x, _ in data.batches(1000, shuffle=False)]
        ).numpy()
    labels = data.y.numpy()
    n = data.info.num_classes
    correct = np.bincount(labels[preds == labels], minlength=n)
    per_class = correct / np.maximum(np.bincount(labels, minlength=n), 1)
    p = np.asarray(class_counts, dtype=float) / max(float(np.sum(class_counts)), 1.0)
    return float((p * per_class).sum())


def extras(run: RunOutput) -> dict[str, Any]:
    """``local_accuracy`` (mean over devices) and ``client_local_accuracy``: each device's final
    model on the evaluation set (test, or the validation split in a sweep), per-class accuracy
    weighted by its training label distribution. The partition is the run's own, rebuilt by the
    run assembly (:func:`edgefl.runtime.setup.assemble`); a device whose shard differs in size from
    the run's record stops the benchmark rather than report a wrong number."""
    from edgefl.export.checkpoint import load_device_model
    from edgefl.runtime.setup import assemble

    cfg = run.config
    if cfg.fleet_file:
        raise ValueError("local_accuracy: fleet files are not supported by this benchmark")
    assembly = assemble(cfg)
    data = assembly.data
    fleet = json.loads((run.run_dir / "config.json").read_text())["fleet"]
    per_device = {}
    for i, device in enumerate(assembly.ids):
        shard = data.shard(i)
        if fleet[device]["num_samples"] != len(shard):
            raise RuntimeError(
                f"local_accuracy: rebuilt shard of {device} has {len(shard)} samples, the run had "
                f"{fleet[device]['num_samples']}: the run assembly changed"
            )
        counts = shard.class_counts()
        per_device[device] = local_split_accuracy(
            load_device_model(run.run_dir, device), data.evals["test"], counts
        )
    return {
        "local_accuracy": statistics.fmean(per_device.values()),
        "client_local_accuracy": per_device,
    }
