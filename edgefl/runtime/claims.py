"""Device numbers are claims: what a device says about itself is bounded and labelled.

**Weights.** A device declares its data size once, at registration (``runtime/server.py``
``Registry``); every aggregation weight a device supplies afterwards (an uplink's ``num_samples``,
a knowledge method's per-class counts, :attr:`ServerHalf.count_arrays`, in their unit) is clipped by
the round loop, before the method aggregates, to the **weight bound**: ``ratio`` × the median
declared size of the fleet (``ServeOptions.max_weight_ratio``, ``--max-weight-ratio``, default
:data:`DEFAULT_WEIGHT_RATIO`; 0 turns the bound off), and a per-class count also to the device's
own declared size. The median moves little when one device lies, so one device's weight is at
most ``ratio`` honest devices' worth however large its claim. Each clip is logged (device, field,
claimed and used values) and kept in the round record (``clipped``). Robust aggregation
(``aggregator=median|trimmed_mean``, ``clip_norm``) is separate and unweighted.

**Reports.** Accuracy, loss and training times come from devices: each is schema-checked (finite,
in range: :mod:`edgefl.wire.schema`) and then kept apart from what the server measures itself
(bytes it received and sent, reply times, completions): :data:`SOURCES` names which is which, and
summaries, round records and the fleet status carry that label.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from statistics import median
from types import MappingProxyType
from typing import Any

import numpy as np

from edgefl.algorithms.base import DeviceRecord
from edgefl.wire import Payload

log = logging.getLogger(__name__)

#: Default weight bound: no device weighs more than this many times the fleet's median declared
#: size.
DEFAULT_WEIGHT_RATIO = 10.0

#: Which figures of a run summary the server measures itself and which are devices' claims.
SOURCES = {
    "server_measured": ["bytes_up_per_round", "bytes_down_per_round", "finish_bytes_down",
                        "finish_failed",
                        "failed_per_round", "final_eval_failed", "rounds_completed", "models_saved",
                        "models_missing",
                        "registrations_rejected", "wall_seconds"],
    # each device's accuracy on its own test data, as it reports it (``measured_by`` says which
    # evaluation request each answered, not who measured)
    "device_reported": ["mean_accuracy", "tier_accuracy", "client_accuracy", "accuracy_per_round",
                        "accuracy_from_round"],
}


def weight_bound(
    fleet: Mapping[str, DeviceRecord], ratio: float, unit: Callable[[int], float] = float
) -> float | None:
    """``ratio`` × the median declared size of the fleet, in ``unit`` (a declared size's worth of
    the quantity bounded: samples, or sample visits per round); None when off or nothing is
    declared."""
    sizes = [unit(r.num_samples) for r in fleet.values() if r.num_samples > 0]
    if ratio <= 0 or not sizes:
        return None
    return ratio * float(median(sizes))


def bound_uplinks(
    round: int,
    uplinks: Mapping[str, Payload],
    fleet: Mapping[str, DeviceRecord],
    ratio: float,
    count_arrays: Mapping[str, str] = MappingProxyType({}),
    visits: Callable[[int], float] = float,
) -> tuple[dict[str, Payload], dict[str, dict[str, list[float]]]]:
    """The uplinks with every device-supplied weight clipped to :func:`weight_bound`, and what was
    clipped: ``{device: {field: [claimed, used]}}`` (logged too).

    ``count_arrays`` names the per-class count arrays with their unit
    (:attr:`ServerHalf.count_arrays`): ``"samples"`` counts are bounded in samples; ``"visits"``
    counts (a sample counted each time local training saw it) in ``visits(declared size)``, the
    sample visits of one round's local training, so an honest device training several epochs is
    never clipped."""
    bound = weight_bound(fleet, ratio)
    if bound is None:
        return dict(uplinks), {}
    units = {"samples": float, "visits": visits}
    bounds = {name: weight_bound(fleet, ratio, units[unit]) for name, unit in count_arrays.items()}
    out: dict[str, Payload] = {}
    clipped: dict[str, dict[str, list[float]]] = {}
    for device_id, p in uplinks.items():
        meta, arrays, mine = p.meta, p.arrays, {}
        n = meta.get("num_samples")
        if isinstance(n, int | float) and not isinstance(n, bool) and n > bound:
            used = max(1, int(bound))
            meta = {**meta, "num_samples": used}
            mine["num_samples"] = [float(n), float(used)]
        record = fleet.get(device_id)
        for name, unit in count_arrays.items():
            a = arrays.get(name)
            cap = bounds[name]
            if record is not None and record.num_samples > 0:
                cap = min(cap, float(units[unit](record.num_samples)))
            if (
                a is None
                or not a.size
                or not np.issubdtype(a.dtype, np.number)
                or float(a.max()) <= cap
            ):
                continue
            limit = np.asarray(int(cap) if a.dtype.kind in "iu" else cap, a.dtype)
            arrays = {**arrays, name: np.minimum(a, limit)}
            mine[name] = [float(a.max()), float(limit)]
        if mine:
            clipped[device_id] = mine
            for field, (claimed, used) in mine.items():
                log.warning(
                    "round %d: device %s claimed %s = %g; clipped to %g (the weight bound: %g x "
                    "the fleet's median declared size)",
                    round,
                    device_id,
                    field,
                    claimed,
                    used,
                    ratio,
                )
            out[device_id] = Payload(arrays, meta)
        else:
            out[device_id] = p
    return out, clipped


def label_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """``summary`` with :data:`SOURCES` attached: which of its figures are measured, which
    claimed."""
    summary["sources"] = {k: [f for f in v if f in summary] for k, v in SOURCES.items()}
    summary["accuracy_reported_by"] = "devices"
    return summary
