"""The sanity gates a benchmark's runs must pass before its claims are read (BENCHMARKS.md, issue
37).

- **Bounds.** The centralized bound is above every federated method and above Local-IID, each
  beyond the noise (the sd over seeds of the two sides, combined); Local-IID reaches 75 %.
- **No collapsed run.** No run within 5 points of chance (1 / classes), no device predicting a
  single class while its training data holds at least two (each ≥ 10 % of its images), and no run
  that stopped at a round where every device failed (``stop_reason``, :mod:`benchmarks.cells`). A
  run that stopped because every device's privacy budget was spent is a legitimate end, not a
  collapse: its accuracy is what the fleet has at that point.

Whether a device predicts one class is *measured* for cells run since this module existed (each
device's final model's predictions on the test set, ``client_predictions``). Cells cached before
carry only accuracies, so for them it is read from what a single-class predictor scores (a
*proxy*, named so on the pages): on the class-balanced test set 1 / classes (a device within
:data:`GLOBAL_MARGIN` of it), and where the run also measured the device's local split (FedHeNN's
metric), the share of the device's largest class there too (within :data:`LOCAL_MARGIN` of it).

A failed bounds gate makes every claim of the benchmark "not comparable"; a collapsed run makes
the claims over it "not comparable". :func:`evaluate` returns both, and the pages list them.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

CHANCE_MARGIN = 0.05  # a run within 5 points of chance
LOCAL_IID_FLOOR = 0.75  # Local on IID shards of a few hundred Fashion-MNIST images (BENCHMARKS.md)
ONE_CLASS_SHARE = 0.95  # a device whose most predicted class takes this share of its predictions
HELD_SHARE = 0.10  # a class the device "holds": at least this share of its training images
GLOBAL_MARGIN = 0.03  # proxy on the class-balanced test set: within 3 points of 1 / classes
# proxy on the device's local split: within 5 points of its largest class's share
LOCAL_MARGIN = 0.05
#: the data settings that decide a partition (rebuilt class counts are shared between the methods)
_DATA_KEYS = (
    "dataset",
    "train_samples",
    "test_samples",
    "validation_samples",
    "clients",
    "partition",
    "alpha",
    "classes_per_client",
    "seed",
    "public_fraction",
    "min_size",
    "tiers",
    "fleet_file",
    "data_dir",
)
_COUNTS: dict[str, dict[str, list[int]]] = {}


def class_counts(record: Mapping[str, Any]) -> dict[str, list[int]]:
    """Per device, its training images per class: recorded by the runner, or rebuilt from the
    run's configuration (same seed, same partition) for cells cached before it recorded them."""
    if record.get("client_class_counts"):
        return dict(record["client_class_counts"])
    config = record["config"]
    key = json.dumps({k: config.get(k) for k in _DATA_KEYS}, sort_keys=True, default=list)
    if key not in _COUNTS:
        from benchmarks.common import device_class_counts

        _COUNTS[key] = {d: counts for d, (_, counts) in device_class_counts(config).items()}
    return _COUNTS[key]


def collapsed_devices(record: Mapping[str, Any]) -> tuple[list[str], str]:
    """(devices predicting a single class while holding ≥ 2, how it was read: measured / proxy)."""
    counts = class_counts(record)
    out = []
    predictions = record.get("client_predictions")
    local = record.get("client_local_accuracy") or {}
    for device, held in counts.items():
        total = sum(held) or 1
        if sum(c >= HELD_SHARE * total for c in held) < 2:
            continue  # a device of one class predicting one class is its data, not a collapse
        if predictions and device in predictions:
            p = predictions[device]
            if max(p) >= ONE_CLASS_SHARE * max(sum(p), 1):
                out.append(device)
        elif device in (record.get("client_accuracy") or {}):
            at_one = record["client_accuracy"][device] <= 1 / len(held) + GLOBAL_MARGIN
            if device in local:  # and on its own split it scores what its largest class gives
                at_one = at_one and local[device] <= max(held) / total + LOCAL_MARGIN
            if at_one:
                out.append(device)
    return out, "measured" if predictions else "proxy"


def run_collapse(record: Mapping[str, Any]) -> list[str]:
    """Why a grid run counts as collapsed (empty: it does not)."""
    reasons = []
    if record.get("stop_reason") == "every device failed":  # benchmarks.cells.ALL_FAILED
        reasons.append(f"stopped at round {record.get('stopped_at_round')}: every device failed "
                       f"({record.get('stop_detail', '')[:160]})")
    counts = class_counts(record)
    classes = len(next(iter(counts.values()))) if counts else 10
    acc = record.get("final_accuracy")
    if acc is not None and acc <= 1 / classes + CHANCE_MARGIN:
        reasons.append(
            f"accuracy {100 * acc:.1f} % within {100 * CHANCE_MARGIN:.0f} points of chance"
        )
    devices, how = collapsed_devices(record)
    if devices:
        reasons.append(f"{len(devices)} of {len(counts)} devices predict one class ({how})")
    return reasons


def _mean_sd(xs: Sequence[float]) -> tuple[float, float]:
    return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0


def bounds_failures(
    bound_runs: Mapping[str, Sequence[Mapping[str, Any]]], runs: Iterable[Mapping[str, Any]]
) -> list[str]:
    """The bounds gate's failures, each a sentence with the numbers."""
    out = []
    central = [r["final_accuracy"] for r in bound_runs.get("centralized", [])]
    local = [r["final_accuracy"] for r in bound_runs.get("local_iid", [])]
    # the protocol's bounds are not optional: a benchmark without them has nothing to check its runs
    # against
    out += [
        f"no {name} runs (the protocol asks for both bounds)"
        for name, xs in (("centralized bound", central), ("Local-IID", local))
        if not xs
    ]
    if local:
        m, _ = _mean_sd(local)
        if m < LOCAL_IID_FLOOR:
            out.append(
                f"Local-IID {100 * m:.1f} % is under the protocol's {100 * LOCAL_IID_FLOOR:.0f} % "
                "(the runs are too short "
                "or the recipe too weak)"
            )
    if not central:
        return out
    c, csd = _mean_sd(central)
    groups: dict[tuple[str, str], list[float]] = {}
    for r in runs:
        if (
            r.get("role", "grid") == "grid"
            and not r.get("derived_from")
            and r.get("config", {}).get("algorithm") != "local"
        ):
            if r["final_accuracy"] is not None:  # none: a run that stopped before an evaluation
                groups.setdefault((r["method"], r["setting"]), []).append(r["final_accuracy"])
    if local:
        m, sd = _mean_sd(local)
        if m - c > math.hypot(sd, csd):
            out.append(
                f"the centralized bound {100 * c:.1f} % is below Local-IID {100 * m:.1f} % by "
                "more than the noise"
            )
    above = []
    for (method, setting), xs in groups.items():
        m, sd = _mean_sd(xs)
        if m - c > math.hypot(sd, csd):
            above.append(f"{method} in {setting} ({100 * m:.1f} ± {100 * sd:.1f} %)")
    if above:
        out.append(
            f"the centralized bound {100 * c:.1f} % is below federated methods by more than the "
            "noise: " + "; ".join(above)
        )
    return out


def collapsed_runs(runs: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """``{"method|setting|seed": [reasons]}`` for the grid runs that collapsed."""
    collapsed = {}
    for r in runs:
        if r.get("role", "grid") != "grid" or r.get("derived_from"):
            continue
        reasons = run_collapse(r)
        if reasons:
            collapsed[run_id(r)] = reasons
    return collapsed


def evaluate(
    bound_runs: Mapping[str, Sequence[Mapping[str, Any]]], runs: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """``{"failures": [...], "collapsed": {"method|setting|seed": [reasons]}}`` over the grid
    runs."""
    return {"failures": bounds_failures(bound_runs, runs), "collapsed": collapsed_runs(runs)}


def run_id(record: Mapping[str, Any]) -> str:
    return f"{record['method']}|{record['setting']}|{record['seed']}"
