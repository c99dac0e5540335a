"""Claims and their verdicts (../shared/specs/BENCHMARKS.md, "Seeds, margins, claims").

A :class:`Claim` is ``"a OP b"`` in one setting on one metric, paired by seed;
:func:`evaluate_claim` gives its verdict in one vocabulary: **reproduced** (mean beyond 2 sd, every
seed agreeing), **not reproduced** (with the measured numbers), **reversed** (significantly the
other way), **not comparable** (with the reason: too few seeds — fewer than 3, or fewer than 5
where a compared method's seeds spread over more than 5 points —, not converged — the last-quarter
slope of a method's mean curve over the seeds at or above :data:`SLOPE_LIMIT` points per 10 % of
rounds —, collapsed runs, failed gates). Non-inferiority rows ("not worse than": mean above −1 sd)
are their own kind and never count as a paper's claim. A :class:`Sweep` picks an open default on a
validation split (:func:`evaluate_sweep`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.cells import Cell

#: Converged: the per-round accuracy moved less than this many points per 10 % of rounds over the
#: last quarter of the run (BENCHMARKS.md).
SLOPE_LIMIT = 0.5
#: Seeds (BENCHMARKS.md): at least 3, and at least :data:`SPREAD_SEEDS` where a compared method's
#: runs spread over more than :data:`SPREAD_POINTS` points (the largest minus the smallest of its
#: seeds, on a metric in points).
SPREAD_SEEDS = 5
SPREAD_POINTS = 5.0
#: What a claim is. Counted as the paper's claims: "paper" (the claim as the paper makes it) and
#: "control" (decides whether a gain is the method's: a claim, BENCHMARKS.md). "implied": every
#: method against Local and FedAvg, a row the paper implies; "not worse": a non-inferiority row;
#: "construction": true by construction (shown, nothing to reproduce); "diagnostic": a measured
#: explanation.
KINDS = {
    "paper": "the paper's claim",
    "control": "control (counted as a claim)",
    "implied": "implied by the paper",
    "not worse": "not worse than",
    "construction": "true by construction",
    "diagnostic": "diagnostic",
}
COUNTED = ("paper", "control")
VERDICTS = ("reproduced", "not reproduced", "reversed", "not comparable")


@dataclass(frozen=True)
class Claim:
    """``statement`` is ``"a OP b"`` with OP one of > ≥ < ≤ (>= <= accepted); paired by seed."""

    id: str
    statement: str
    setting: str
    metric: str = "final_accuracy"
    metric_a: str | None = None
    metric_b: str | None = None
    note: str = ""
    #: one of :data:`KINDS`; "paper", "control" and "implied" are strict (> or <), "not worse" weak
    #: (≥ or ≤)
    kind: str = "paper"
    #: the paper's own number for the claim (its table, dataset and setting), shown beside the
    #: verdict
    paper: str = ""
    #: the earlier spelling of kind="diagnostic" (kept for declarations written before the kinds)
    diagnostic: bool = False

    def __post_init__(self):
        if self.diagnostic:
            object.__setattr__(self, "kind", "diagnostic")
        if self.kind not in KINDS:
            raise ValueError(f"claim {self.id}: kind {self.kind!r} is not one of {sorted(KINDS)}")
        op = self.parse()[1]
        if self.kind in ("paper", "control", "implied") and op not in (">", "<"):
            raise ValueError(f"claim {self.id}: a claim of improvement is strict (> or <); "
                             f"a non-inferiority check is kind='not worse'")
        if self.kind == "not worse" and op not in ("≥", "≤"):
            raise ValueError(f"claim {self.id}: a 'not worse' row reads ≥ or ≤")

    def parse(self) -> tuple[str, str, str]:
        for op in ("≥", "≤", ">=", "<=", ">", "<"):
            a, sep, b = self.statement.partition(f" {op} ")
            if sep:
                return a.strip(), {">=": "≥", "<=": "≤"}.get(op, op), b.strip()
        raise ValueError(
            f"claim {self.id}: cannot parse {self.statement!r} (use 'a > b', 'a ≥ b', …)"
        )


@dataclass(frozen=True)
class Sweep:
    """A default the paper leaves open, chosen on the validation split by mean ``metric``.

    With ``default`` (the method's current value, in ``grid``) the sweep keeps it unless the best
    value beats it by more than the noise (the larger sd over seeds of the two): a difference
    inside the noise does not move a default."""

    parameter: str
    grid: Sequence[Any]
    cells: Mapping[Any, Sequence[Cell]]  # grid value → its cells (seeds, settings)
    metric: str = "final_accuracy"
    note: str = ""
    default: Any = None

    def __post_init__(self):
        if self.default is not None and self.default not in self.grid:
            raise ValueError(
                f"sweep {self.parameter}: the default {self.default!r} is not in the grid "
                f"{list(self.grid)}"
            )


class MetricMissing(KeyError):
    """A run has no value for the metric a claim or sweep names (not produced yet)."""


def metric_value(record: Mapping[str, Any], path: str) -> float:
    """``record``'s metric at a dotted ``path`` (``per_tier.1``), or the difference ``"a - b"`` of
    two."""
    if " - " in path:
        a, b = path.split(" - ", 1)
        return metric_value(record, a) - metric_value(record, b)
    value: Any = record
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            value = None
            break
        value = value[part]
    if value is None:
        raise MetricMissing(
            f"run {record.get('method')}/{record.get('setting')}/s{record.get('seed')} has no "
            f"metric {path!r}"
        )
    return float(value)


def paired_difference(
    runs: Iterable[Mapping[str, Any]],
    a: str,
    b: str,
    setting: str,
    *,
    method: str,
    as_setting: str | None = None,
) -> list[dict[str, Any]]:
    """Derived runs ``a − b`` in ``setting``, paired by seed: every numeric top-level metric and
    every tier of ``per_tier`` differenced, labelled ``method`` in ``as_setting``; their slope is
    the larger of the pair's, so a claim on a difference is read only where both runs converged."""
    by = {
        (r["method"], r["seed"]): r
        for r in runs
        if r["setting"] == setting and r.get("role", "grid") == "grid"
    }
    out = []
    for seed in sorted({s for (m, s) in by if m == a} & {s for (m, s) in by if m == b}):
        ra, rb = by[(a, seed)], by[(b, seed)]
        record: dict[str, Any] = {
            "method": method,
            "setting": as_setting or setting,
            "seed": seed,
            "role": "grid",
            "derived_from": [a, b, setting],
        }
        for k, v in ra.items():
            if (
                k in ("seed", "wall_seconds", "slope")
                or isinstance(v, bool)
                or not isinstance(v, (int, float))
            ):
                continue
            if isinstance(rb.get(k), (int, float)) and not isinstance(rb.get(k), bool):
                record[k] = v - rb[k]
        tiers = set(ra.get("per_tier") or {}) & set(rb.get("per_tier") or {})
        record["per_tier"] = {t: ra["per_tier"][t] - rb["per_tier"][t] for t in sorted(tiers)
                              if ra["per_tier"][t] is not None and rb["per_tier"][t] is not None}
        slopes = [ra.get("slope"), rb.get("slope")]
        record["slope"] = None if None in slopes else max(slopes, key=abs)
        out.append(record)
    return out


def statistic(op: str, diffs: Sequence[float]) -> tuple[str, float, float]:
    """(what the paired differences alone say, mean, sd): for > and <, "reproduced" (mean beyond
    2 sd the claimed way, every seed agreeing), "reversed" (the same, the other way) or "not
    reproduced"; for ≥ and ≤ (a "not worse" row), "not worse" (mean above −1 sd; below +1 sd for
    ≤) or "worse"."""
    mean = statistics.fmean(diffs)
    sd = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
    sign = 1 if op in (">", "≥") else -1
    m, ds = sign * mean, [sign * d for d in diffs]
    if op in ("≥", "≤"):
        return ("not worse" if (m > -sd if sd > 0 else m >= 0) else "worse"), mean, sd
    if m > 2 * sd and all(d > 0 for d in ds):
        return "reproduced", mean, sd
    if m < -2 * sd and all(d < 0 for d in ds):
        return "reversed", mean, sd
    return "not reproduced", mean, sd


def evaluate_claim(
    claim: Claim,
    runs: Iterable[Mapping[str, Any]],
    *,
    collapsed: Mapping[str, Sequence[str]] | None = None,
    gate_failures: Sequence[str] = (),
) -> dict[str, Any]:
    """A claim's verdict (:data:`VERDICTS`; "not worse" / "worse" for a "not worse" row) with its
    ``reason``: the measured numbers where it is not reproduced, why where it is not comparable
    (no runs, a metric missing, fewer than 3 seeds or than :data:`SPREAD_SEEDS` where a compared
    method's seeds spread wide, not converged, collapsed runs — ``collapsed``
    maps :func:`benchmarks.gates.run_id` to reasons —, a failed gate). ``statistic`` is what the
    paired differences alone say."""
    a, op, b = claim.parse()
    metric_a, metric_b = claim.metric_a or claim.metric, claim.metric_b or claim.metric
    runs = list(runs)
    by = {
        (r["method"], r["setting"], r["seed"]): r for r in runs if r.get("role", "grid") == "grid"
    }
    seeds = sorted(
        {s for (m, st, s) in by if m == a and st == claim.setting}
        & {s for (m, st, s) in by if m == b and st == claim.setting}
    )
    out = {
        "id": claim.id,
        "statement": claim.statement,
        "a": a,
        "b": b,
        "op": op,
        "setting": claim.setting,
        "metric": claim.metric,
        "metric_a": metric_a,
        "metric_b": metric_b,
        "seeds": seeds,
        "note": claim.note,
        "kind": claim.kind,
        "paper": claim.paper,
    }
    empty = {
        "mean_diff": None,
        "sd": None,
        "signs": [],
        "converged": False,
        "holds": False,
        "statistic": None,
    }
    if not seeds:
        return {**out, **empty, "verdict": "not comparable", "reason": "no runs"}
    try:
        diffs = [
            metric_value(by[(a, claim.setting, s)], metric_a)
            - metric_value(by[(b, claim.setting, s)], metric_b)
            for s in seeds
        ]
    except MetricMissing as e:
        return {
            **out,
            **empty,
            "verdict": "not comparable",
            "reason": f"metric missing: {e.args[0]}",
            "missing": str(e.args[0]),
        }
    stat, mean, sd = statistic(op, diffs)
    signs = [int(math.copysign(1, d)) if d != 0 else 0 for d in diffs]
    per_method = {
        m: [by[(m, claim.setting, s)].get("slope") for s in seeds] for m in dict.fromkeys((a, b))
    }
    slopes = [x for xs in per_method.values() for x in xs]
    # A method's slope is that of its mean curve over the seeds (the mean of the runs' slopes): the
    # protocol reads a claim where every compared *method* has flattened. One run's least-squares
    # slope over a noisy last quarter (half participation swings a curve by 1–2 points per
    # evaluation) has a standard error near the limit itself, so the largest of ten such slopes
    # crosses it by chance in runs that have converged; the mean over seeds averages that noise out.
    method_slopes = [None if None in xs else statistics.fmean(xs) for xs in per_method.values()]
    converged = all(x is not None and abs(x) < SLOPE_LIMIT for x in method_slopes)
    # collapsed runs among the compared ones (a derived run's are its sources')
    fallen = []
    for s in seeds:
        for m in dict.fromkeys((a, b)):
            r = by[(m, claim.setting, s)]
            sources = (
                [(x, r["derived_from"][2]) for x in r["derived_from"][:2]]
                if r.get("derived_from")
                else [(m, claim.setting)]
            )
            for src_m, src_s in sources:
                why = (collapsed or {}).get(f"{src_m}|{src_s}|{s}")
                if why:
                    fallen.append(f"{src_m} seed {s} ({'; '.join(why)})")
    fallen = list(dict.fromkeys(fallen))
    scale = metric_scale(metric_a)
    unit = " points" if scale == 100 else ""
    measured = (
        f"{scale * mean:+.2f} ± {scale * sd:.2f}{unit} (mean ± sd of {len(diffs)} paired "
        "differences), "
        f"{sum(1 for x in signs if x == (1 if op in ('>', '≥') else -1))} of {len(signs)} seeds "
        "the claimed way"
    )
    why = []  # every reason the runs cannot answer, most basic first
    if gate_failures:
        why.append("the benchmark fails its sanity gates: " + "; ".join(gate_failures))
    if fallen:
        why.append("collapsed runs: " + "; ".join(fallen))
    if len(seeds) < 3:
        why.append(f"{len(seeds)} seed(s), the protocol reads ≥ 3")
    elif len(seeds) < SPREAD_SEEDS and scale == 100:
        wide = {}
        for m, metric in dict.fromkeys(((a, metric_a), (b, metric_b))):
            values = [metric_value(by[(m, claim.setting, s)], metric) for s in seeds]
            if (spread := scale * (max(values) - min(values))) > SPREAD_POINTS:
                wide[m] = spread
        if wide:
            why.append(f"{len(seeds)} seeds where the protocol reads ≥ {SPREAD_SEEDS}: "
                       + ", ".join(f"{m}'s spread over {x:.1f} points" for m, x in wide.items())
                       + f" (> {SPREAD_POINTS:g})")
    if not converged:
        unknown = [m for m, x in zip(per_method, method_slopes, strict=True) if x is None]
        worst = max((abs(x) for x in method_slopes if x is not None), default=None)
        if unknown:  # e.g. a run that stopped before the last quarter of its rounds
            why.append("not converged: no last-quarter slope for " + ", ".join(unknown)
                       + " (a run without evaluations in the last quarter of its rounds)")
        if worst is not None and worst >= SLOPE_LIMIT:
            rising = [m for m, x in zip(per_method, method_slopes, strict=True)
                      if x is not None and abs(x) >= SLOPE_LIMIT]
            why.append(f"not converged: method slope {worst:.2f} ≥ {SLOPE_LIMIT} points per 10 % "
                       f"of rounds ({', '.join(rising)})")
    verdict = "not comparable" if why else stat
    reason = " | ".join(why) + f" (the numbers alone: {stat}; {measured})" if why else measured
    return {**out, "mean_diff": mean, "sd": sd, "diffs": diffs, "signs": signs, "statistic": stat,
            "converged": converged, "collapsed_runs": fallen,
            "method_slope": max((abs(x) for x in method_slopes if x is not None), default=None),
            "max_abs_slope": max((abs(x) for x in slopes if x is not None), default=None),
            "holds": verdict in ("reproduced", "not worse"), "verdict": verdict, "reason": reason}


def evaluate_sweep(sweep: Sweep, records: Mapping[Cell, Mapping[str, Any]]) -> dict[str, Any]:
    means, sds = [], []
    missing = None
    for value in sweep.grid:
        try:
            vals = [metric_value(records[c], sweep.metric) for c in sweep.cells[value]]
        except MetricMissing as e:
            missing = str(e.args[0])
            means.append(None)
            sds.append(None)
            continue
        means.append(statistics.fmean(vals))
        sds.append(statistics.stdev(vals) if len(vals) > 1 else 0.0)
    best = None if missing else sweep.grid[max(range(len(means)), key=lambda i: means[i])]
    chosen, kept = best, False
    if (
        best is not None
        and sweep.default is not None
        and sweep.default in sweep.grid
        and best != sweep.default
    ):
        b, d = sweep.grid.index(best), sweep.grid.index(sweep.default)
        if means[b] - means[d] <= max(sds[b], sds[d]):
            chosen, kept = sweep.default, True
    return {"parameter": sweep.parameter, "grid": list(sweep.grid), "validation_accuracy": means,
            "validation_sd": sds, "metric": sweep.metric, "chosen": chosen, "best": best,
            "default": sweep.default, "kept_default": kept, "note": sweep.note,
            "seeds": sorted({c.seed for v in sweep.grid for c in sweep.cells[v]}),
            **({"missing": missing} if missing else {})}



def mean_sd(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and sd (0 for one value, nan for none) of the values that are not None."""
    xs = [x for x in xs if x is not None]
    if not xs:
        return float("nan"), float("nan")
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)



def metric_scale(metric: str) -> int:
    """Accuracies (fractions) are shown in points; other metrics (bytes, seconds) as they are."""
    return (
        100 if "accuracy" in metric or metric.startswith("per_tier") or "agreement" in metric else 1
    )
