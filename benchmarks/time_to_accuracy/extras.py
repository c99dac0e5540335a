"""The hook every time-to-accuracy cell runs
(``record_extras="benchmarks.time_to_accuracy.extras:extras"``).

Apart from the grid and the page (:mod:`benchmarks.time_to_accuracy`), so that the cells' code
hash (:mod:`benchmarks.provenance`) covers what a cell runs, not the page's text; it must not
import the benchmark's package.
"""

from __future__ import annotations

from statistics import mean
from typing import Any

from benchmarks.cells import RunOutput

#: the accuracies whose first crossing a cell records (``time_to_70``, ``rounds_to_80``, ...)
THRESHOLDS = (0.7, 0.8)


def extras(out: RunOutput) -> dict[str, Any]:
    """From the finished run: the simulated clock after each round, when the per-round accuracy
    first reached each threshold (simulated seconds, rounds, device updates aggregated), and the
    fleet as the clock saw it (devices offline when a round selected, updates lost)."""
    rounds = [r for r in out.rounds if r.get("phase", "train") == "train"]
    if "simulated_seconds" not in out.summary:  # the bounds: no fleet, no clock
        return {}
    clock = [r["simulated_seconds"] for r in rounds]
    acc = [(r.get("eval") or {}).get("mean_accuracy") for r in rounds]
    if acc and acc[-1] is None:
        acc[-1] = out.summary["mean_accuracy"]  # the final evaluation closes the curve
    record: dict[str, Any] = {"clock": clock, "simulated_seconds": out.summary["simulated_seconds"]}
    updates = 0
    reached: dict[float, tuple[float, int, int]] = {}
    for i, r in enumerate(rounds):
        updates += len(r["completed"])
        for t in THRESHOLDS:
            if t not in reached and acc[i] is not None and acc[i] >= t:
                reached[t] = (clock[i], i + 1, updates)
    for t in THRESHOLDS:
        key = f"{round(100 * t)}"
        seconds, nrounds, nupdates = reached.get(t, (None, None, None))
        record.update(
            {f"time_to_{key}": seconds, f"rounds_to_{key}": nrounds, f"updates_to_{key}": nupdates}
        )
    sync = [r["clock"] for r in rounds if "clock" in r]
    if sync:
        # every device of the fleet is a candidate in simulation: the share offline when selected
        record["offline_at_selection"] = mean(len(c["offline"]) / out.config.clients for c in sync)
    record["updates_lost"] = sum(len(r["failed"]) for r in rounds)
    record["updates_aggregated"] = updates
    return record
