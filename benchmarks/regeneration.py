"""What regenerating a benchmark's page costs (issue 37: every page states the measured time and
load of its regeneration on 2 cores, target at most an hour), from the records of the cells it
reports.

:func:`regeneration` (results.json's ``regeneration``) groups the cells by the invocation that ran
them (``invocation``, recorded since :func:`benchmarks.cells.new_invocation`), else by the commit
they ran at (``code``): per group the number of cells, the measured span from the earliest start
to the latest finish, the sum of the cells' wall and CPU seconds and the machine's 1-minute load
where the records keep them. A record from before ``started_at`` existed starts at ``finished_at``
minus its wall time (its run alone); one without ``finished_at`` has no time at all. Then the
estimate at 2 workers on an idle machine: the cells' CPU seconds over 2 where every cell has them,
else their wall seconds over 2 (wall times move with the machine's load). :func:`paragraph` is the
page's text of it (:mod:`benchmarks.pages`).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

#: the machine a page's regeneration is estimated for (issue 37) and the target
WORKERS = 2
TARGET_SECONDS = 3600
#: where a benchmark keeps a whole regeneration of its page, measured: ``python -m
#: benchmarks.<name> --workers 2 --out benchmarks/<name>/regeneration`` (:func:`measured`)
MEASURED_DIR = "regeneration"


def _parse(text: str | None) -> datetime | None:
    if not text:
        return None
    try:  # the records' format ("+0000", which 3.10's fromisoformat does not read)
        at = datetime.strptime(text, "%Y-%m-%dT%H:%M:%S%z")
    except ValueError:
        at = datetime.fromisoformat(text)
    return at if at.tzinfo is not None else at.replace(tzinfo=timezone.utc)


def cell_times(record: Mapping[str, Any]) -> tuple[datetime, datetime] | None:
    """(start, finish) of a cell; None for a record without ``finished_at``."""
    end = _parse(record.get("finished_at"))
    if end is None:
        return None
    start = _parse(record.get("started_at"))
    if start is None:
        start = end - timedelta(seconds=record.get("wall_seconds") or 0.0)
    return start, end


def unique(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """One record per key: cells that share a configuration (a sweep value that is also a grid
    cell) run once."""
    seen: dict[Any, Mapping[str, Any]] = {}
    for r in records:
        seen.setdefault(r.get("key") or id(r), r)
    return list(seen.values())


def _stamp(at: datetime) -> str:
    return at.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _group(by: str, name: str, rs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    times = [t for r in rs if (t := cell_times(r)) is not None]
    start = min(t[0] for t in times) if times else None
    end = max(t[1] for t in times) if times else None
    cpu = [r["cpu_seconds"] for r in rs if r.get("cpu_seconds") is not None]
    loads = [r[k] for r in rs for k in ("load_at_start", "load_at_end") if r.get(k) is not None]
    # the time a cell spent outside its run (set-up, predictions, the record's hook), where the
    # record has both ends of the cell
    outside = []
    for r in rs:
        if r.get("started_at") and (t := cell_times(r)) is not None:
            outside.append((t[1] - t[0]).total_seconds() - (r.get("wall_seconds") or 0.0))
    return {
        "by": by,
        "id": name,
        "commits": sorted({r.get("code") or "unknown" for r in rs}),
        # the cells' roles (grid, bound, sweep): a group of sweep cells alone can be read from an
        # earlier run while the claims' cells are rerun (:func:`own_measured`)
        "roles": sorted({r.get("role") or "unknown" for r in rs}),
        "cells": len(rs),
        "cells_with_time": len(times),
        "start": None if start is None else start.isoformat(),
        "end": None if end is None else end.isoformat(),
        "span_minutes": None if start is None else (end - start).total_seconds() / 60,
        "wall_seconds": sum(r.get("wall_seconds") or 0.0 for r in rs),
        "cpu_seconds": sum(cpu) if len(cpu) == len(rs) else None,
        "cells_with_cpu": len(cpu),
        "load": [min(loads), max(loads)] if loads else None,
        "outside_run_seconds": sum(outside) if outside else None,
        "cells_with_start": len(outside),
    }


def regeneration(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """results.json's ``regeneration`` over the records of the cells a page reports."""
    rs = unique(records)
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for r in rs:
        key = ("invocation", r["invocation"]) if r.get("invocation") else \
            ("commit", r.get("code") or "unknown")
        groups.setdefault(key, []).append(r)
    out = [_group(by, name, g) for (by, name), g in groups.items()]
    out.sort(key=lambda g: (g["start"] is None, g["start"] or "", g["id"]))
    wall = sum(g["wall_seconds"] for g in out)
    every_cpu = bool(rs) and all(g["cpu_seconds"] is not None for g in out)
    cpu = sum(g["cpu_seconds"] for g in out) if every_cpu else None
    estimate = (cpu if every_cpu else wall) / WORKERS
    return {
        "cells": len(rs),
        "groups": out,
        "wall_seconds": wall,
        "cpu_seconds": cpu,
        "cells_with_cpu": sum(g["cells_with_cpu"] for g in out),
        "workers": WORKERS,
        "estimate_from": "cpu_seconds" if every_cpu else "wall_seconds",
        "estimate_seconds": estimate,
        "target_seconds": TARGET_SECONDS,
        "target_met": estimate <= TARGET_SECONDS,
    }


def _run_shift(page_runs: Sequence[Mapping[str, Any]], there: Sequence[Mapping[str, Any]],
               ) -> dict[str, Any] | None:
    """How far the same runs (method, setting, seed) moved between the page and its regeneration:
    final accuracy there minus here, in points (None when no run matches)."""
    def by(runs):
        return {(r.get("method"), r.get("setting"), r.get("seed")): r.get("final_accuracy")
                for r in runs if r.get("final_accuracy") is not None}

    here, regenerated = by(page_runs), by(there)
    diffs = [100 * (regenerated[k] - here[k]) for k in here if k in regenerated]
    if not diffs:
        return None
    return {"runs": len(diffs), "mean": statistics.fmean(diffs), "sd": statistics.pstdev(diffs),
            "max_abs": max(map(abs, diffs))}


def _sweeps_alone(g: Mapping[str, Any]) -> bool:
    """A group of sweep cells only (a group recorded before groups kept roles: not known so)."""
    return bool(g.get("roles")) and set(g["roles"]) == {"sweep"}


def _one_run(results: Mapping[str, Any], *, sweeps_read: bool = False) -> dict[str, Any] | None:
    """The one group of a results.json's cells when they all ran in one invocation at one clean
    commit and none is missing (a whole run, measured); None otherwise. ``sweeps_read``: groups of
    sweep cells alone may lie beside it (sweeps run earlier and read, not rerun)."""
    groups = (results.get("regeneration") or {}).get("groups") or []
    if sweeps_read:
        groups = [g for g in groups if not _sweeps_alone(g)]
    if results.get("missing") or len(groups) != 1 or groups[0]["by"] != "invocation" \
            or len(groups[0]["commits"]) != 1 or groups[0]["commits"][0].endswith("+dirty"):
        return None
    return groups[0]


def _block_of(before: Mapping[str, Any], after: Mapping[str, Any], g: Mapping[str, Any]) -> bool:
    """Whether a results.json's machine block is that of the run ``g``: it names ``g``'s
    invocation, or (a block from before blocks named one) its start and end dates hold ``g``'s
    span (a minute's slack); a block that says neither is taken as the run's."""
    if before.get("invocation") is not None:
        return before["invocation"] == g["id"]
    try:
        start, end = (datetime.strptime(b["date"], "%Y-%m-%d %H:%M:%S UTC").replace(
            tzinfo=timezone.utc) for b in (before, after))
    except (KeyError, TypeError, ValueError):
        return True
    if g.get("start") is None or g.get("end") is None:
        return True
    slack = timedelta(minutes=1)
    return start - slack <= _parse(g["start"]) and _parse(g["end"]) <= end + slack


def machine_of(previous: Mapping[str, Any] | None, regen: Mapping[str, Any],
               now: Mapping[str, Any]) -> Mapping[str, Any]:
    """The machine block of a report rewritten from cached cells: the page's earlier block where it
    is that of the run that made the claims' cells (the group holding them, else the largest),
    else the cores and CPU alone (no loads: another run's would be misread as this one's)."""
    groups = [g for g in regen.get("groups") or [] if not _sweeps_alone(g)]
    if previous and groups:
        g = max(groups, key=lambda x: x["cells"])
        if _block_of(previous.get("before") or {}, previous.get("after") or {}, g):
            return previous
    before = (previous or now).get("before") or {}
    return {"before": {"cpu": before.get("cpu"), "cores": before.get("cores")}, "after": {}}


def _run_facts(g: Mapping[str, Any], machine: Mapping[str, Any] | None,
               target: float = TARGET_SECONDS) -> dict[str, Any]:
    """What a page states of a whole run (:func:`_one_run`'s group) against its ``target`` in
    seconds: its commit, cells, span, CPU and loads, and the machine that ran it."""
    before, after = (machine or {}).get("before") or {}, (machine or {}).get("after") or {}
    if not _block_of(before, after, g):  # the block of another run (a report kept its machine)
        before, after = {"cpu": before.get("cpu"), "cores": before.get("cores")}, {}
    return {
        "commit": g["commits"][0],
        "cells": g["cells"],
        "start": g["start"],
        "end": g["end"],
        "span_minutes": g["span_minutes"],
        "cpu_seconds": g["cpu_seconds"],
        "cell_load": g["load"],
        "load_start": before.get("loadavg_1_5_15"),
        "load_end": after.get("loadavg_1_5_15"),
        "cpu": before.get("cpu"),
        "cores": before.get("cores"),
        "target_seconds": target,
        "target_met": g["span_minutes"] is not None and g["span_minutes"] * 60 <= target,
    }


def _claim_key(c: Mapping[str, Any]) -> tuple:
    """A claim row's identity across two runs of a page: one claim may be read on several metrics
    (per tier)."""
    return c["statement"], c["setting"], c.get("metric_a"), c.get("metric_b")


def measured(bench_dir: Path, claims: Sequence[Mapping[str, Any]],
             runs: Sequence[Mapping[str, Any]] = (), cells: int | None = None,
             ) -> dict[str, Any] | None:
    """The page's regeneration as measured: the run kept in ``bench_dir/regeneration`` (every cell
    rerun into a fresh folder, the committed cells untouched), when its cells come from one
    invocation at one clean commit; None without one. Its span, CPU and loads, the machine and the
    load at its start and end, its claims' count and the rows whose verdict differs from the
    page's ``claims``, and how far the same runs moved (``runs``: the page's). None too where the
    run's number of cells differs from the page's (``cells``): it regenerated another version."""
    path = Path(bench_dir) / MEASURED_DIR / "results.json"
    if not path.exists():
        return None
    from benchmarks.pages import counts  # the page module imports this one

    there = json.loads(path.read_text())
    g = _one_run(there)
    if g is None:
        return None  # not one whole run from clean code: nothing measured to state
    if cells is not None and g["cells"] != cells:
        return None  # a regeneration of another version of the page (other cells, other seeds)

    verdict = {_claim_key(c): c["verdict"] for c in there.get("claims", [])}
    differ = [
        {"statement": c["statement"], "setting": c["setting"], "metric": c.get("metric_a"),
         "page": c["verdict"], "regenerated": verdict.get(_claim_key(c), "absent")}
        for c in claims if verdict.get(_claim_key(c)) != c["verdict"]
    ]
    return {
        "folder": MEASURED_DIR,
        **_run_facts(g, there.get("machine")),
        "reproduced": list(counts(there.get("claims", []))),
        "differ": differ,
        "run_shift": _run_shift(runs, there.get("runs", [])),
    }


#: where a benchmark keeps its quick profile's run, measured: ``python -m benchmarks.<name> --quick
#: --workers 2 --out benchmarks/<name>/quick`` (:func:`quick_measured`)
QUICK_DIR = "quick"
#: issue 37: ``--quick`` reproduces the signs of the main claims in at most 10 minutes
QUICK_TARGET_SECONDS = 600


def _sign(x: float | None) -> int:
    return 0 if not x else (1 if x > 0 else -1)


def quick_measured(bench_dir: Path, claims: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The quick profile as measured: the run kept in ``bench_dir/quick`` when its cells come from
    one invocation at one clean commit (None without one): its span against the 10-minute target,
    and for each counted claim of the page (``claims``) the quick run's paired difference beside
    the page's, matched by statement, setting and metrics; where no claim matches on its metrics
    but exactly one of the quick run's has the same statement and setting, that one, marked as on
    another metric. A sign agrees when both means are non-zero and of the same sign."""
    path = Path(bench_dir) / QUICK_DIR / "results.json"
    if not path.exists():
        return None
    from benchmarks.claims import metric_scale
    from benchmarks.pages import is_counted  # the page module imports this one

    there = json.loads(path.read_text())
    g = _one_run(there)
    if g is None:
        return None
    quick = there.get("claims", [])
    exact = {_claim_key(c): c for c in quick}
    rows = []
    for c in claims:
        if not is_counted(c):
            continue
        q = exact.get(_claim_key(c))
        other = False
        if q is None:
            same = [x for x in quick if (x["statement"], x["setting"]) ==
                    (c["statement"], c["setting"])]
            q, other = (same[0], True) if len(same) == 1 else (None, False)
        if q is None:
            continue
        rows.append({
            "statement": c["statement"], "setting": c["setting"],
            "metric": c.get("metric_a"), "metric_b": c.get("metric_b"),
            "quick_metric": q.get("metric_a"), "other_metric": other,
            "scale": metric_scale(c.get("metric_a") or "final_accuracy"),
            "quick_scale": metric_scale(q.get("metric_a") or "final_accuracy"),
            "quick_mean": q.get("mean_diff"), "quick_sd": q.get("sd"),
            "quick_signs": q.get("signs") or [], "page_mean": c.get("mean_diff"),
            "agree": _sign(q.get("mean_diff")) != 0
            and _sign(q.get("mean_diff")) == _sign(c.get("mean_diff")),
        })
    return {
        "folder": QUICK_DIR,
        **_run_facts(g, there.get("machine"), QUICK_TARGET_SECONDS),
        "command": there.get("command"),
        "rows": rows,
        "agree": sum(r["agree"] for r in rows),
        "counted": sum(is_counted(c) for c in claims),
    }


def quick_paragraph(m: Mapping[str, Any] | None) -> list[str]:
    """The page's words for :func:`quick_measured` (empty without a measured quick run)."""
    if not m:
        return []

    def signs(r):
        return " ".join({1: "+", -1: "−", 0: "0"}[_sign(x)] for x in r["quick_signs"])

    def num(x, scale):
        return "—" if x is None else f"{scale * x:+.2f}"

    cpu = f", Σ CPU {m['cpu_seconds']:,.0f} s" if m.get("cpu_seconds") is not None else ""
    load = ("; 1-minute load {:.2f}–{:.2f} at the cells' ends".format(*m["cell_load"])
            if m.get("cell_load") else "")
    lines = [
        f"Quick profile (`--quick`: the main claims' signs, not their verdicts): measured in one "
        f"run at clean `{m['commit']}` into [`{m['folder']}/`]({m['folder']}/results.md), "
        f"{m['cells']} cells on {m['cores']} cores ({m['cpu']}): **{m['span_minutes']:.1f} min** "
        f"({_stamp(_parse(m['start']))} to {_stamp(_parse(m['end']))}{cpu}{load}). Target "
        f"≤ {m['target_seconds'] / 60:.0f} min: **{'met' if m['target_met'] else 'not met'}**. "
        f"Signs of the counted claims' mean paired differences agree with this page's for "
        f"**{m['agree']} of {len(m['rows'])}** compared"
        + (f" ({m['counted'] - len(m['rows'])} of this page's {m['counted']} counted claims are "
           "over settings the quick profile does not run)" if m["counted"] > len(m["rows"])
           else "") + ".",
    ]
    if m["rows"]:
        lines += ["", "| claim | setting | metric | quick: mean ± sd (signs per seed) | "
                  "here: mean | same sign |", "|---|---|---|---|---|---|"]
        for r in m["rows"]:
            metric = (f"`{r['metric']}`" if r["metric"] == r["metric_b"]
                      else f"`{r['metric']}` vs `{r['metric_b']}`")
            if r["other_metric"]:
                metric += f" (quick: `{r['quick_metric']}`)"
            sd = ("" if r["quick_sd"] is None or len(r["quick_signs"]) < 2
                  else f" ± {r['quick_scale'] * r['quick_sd']:.2f}")
            lines.append(
                f"| `{r['statement']}` | {r['setting']} | {metric} | "
                f"{num(r['quick_mean'], r['quick_scale'])}{sd} ({signs(r)}) | "
                f"{num(r['page_mean'], r['scale'])} | {'yes' if r['agree'] else 'no'} |")
    return lines


def own_measured(results: Mapping[str, Any]) -> dict[str, Any] | None:
    """The page's own cells as a measured regeneration: when they all ran in one invocation at one
    clean commit and none is missing, their span is what regenerating the page took (the machine
    and loads of the run that made them, which a report from the cache keeps). None otherwise."""
    g = _one_run(results, sweeps_read=True)
    if g is None:
        return None
    from benchmarks.pages import counts  # the page module imports this one

    read = [x for x in results["regeneration"]["groups"] if x is not g and _sweeps_alone(x)]
    wall = sum(x["wall_seconds"] for x in read)
    return {"folder": None, **_run_facts(g, results.get("machine")),
            "reproduced": list(counts(results.get("claims", []))), "differ": [], "run_shift": None,
            # sweep cells from earlier runs, read (their cost if rerun: Σ wall / workers)
            "sweeps_read": {"cells": sum(x["cells"] for x in read), "wall_seconds": wall,
                            "estimate_seconds": wall / WORKERS} if read else None}


def measured_paragraph(m: Mapping[str, Any] | None, claims_here: tuple[int, int]) -> list[str]:
    """The page's words for :func:`measured` (empty without a measured regeneration)."""
    if not m:
        return []
    load = (f"1-minute load {m['load_start'][0]:.2f} at the start and {m['load_end'][0]:.2f} at "
            "the end" if m.get("load_start") and m.get("load_end") else
            "1-minute load {:.2f}–{:.2f} at the cells' starts and ends".format(*m["cell_load"])
            if m.get("cell_load") else "load not recorded")
    cpu = f", Σ CPU {m['cpu_seconds']:,.0f} s" if m.get("cpu_seconds") is not None else ""
    same = ("every claim's verdict the same as on this page" if not m["differ"] else
            f"{len(m['differ'])} verdict(s) differ: " + "; ".join(
                f"`{d['statement']}` [{d['setting']}"
                + ("" if d.get("metric") in (None, "final_accuracy") else f", {d['metric']}")
                + f"] {d['page']} here, {d['regenerated']} there"
                for d in m["differ"]))
    shift = m.get("run_shift")
    moved = (f" The same {shift['runs']} runs (method, setting, seed) moved by "
             f"{shift['mean']:+.2f} ± {shift['sd']:.2f} points there (at most "
             f"{shift['max_abs']:.2f}; the page's cells ran at other commits, on another "
             "machine where the page's regeneration records say so): a verdict near the 2 sd line "
             "can turn with such a shift."
             if shift else "")
    if m.get("folder") is None:  # the page's own cells (:func:`own_measured`)
        read = m.get("sweeps_read")
        whose = (f"this page's {m['cells']} grid and bound cells" if read else
                 f"this page's {m['cells']} cells")
        return [
            f"Measured: {whose} ran in one invocation at clean "
            f"`{m['commit']}` on {m['cores']} cores ({m['cpu']}): **{m['span_minutes']:.1f} min** "
            f"({_stamp(_parse(m['start']))} to {_stamp(_parse(m['end']))}{cpu}; {load}), which is "
            f"what regenerating {'them' if read else 'it'} took. Target ≤ "
            f"{m['target_seconds'] / 60:.0f} min: "
            f"**{'met' if m['target_met'] else 'not met'}**, measured on this machine."
            + (f" Not in that run: the page's {read['cells']} sweep cells, which chose the "
               "defaults and are read from their earlier runs (listed above); rerunning them "
               f"too would add about {read['estimate_seconds'] / 60:.0f} min (their Σ wall "
               f"seconds / {WORKERS}, on the machines that ran them)." if read else ""),
        ]
    return [
        f"Measured: the whole page regenerated in one run at clean `{m['commit']}` into "
        f"[`{m['folder']}/`]({m['folder']}/results.md) (the committed cells untouched), "
        f"{m['cells']} cells on {m['cores']} cores ({m['cpu']}): **{m['span_minutes']:.1f} min** "
        f"({_stamp(_parse(m['start']))} to {_stamp(_parse(m['end']))}{cpu}; {load}). Target "
        f"≤ {m['target_seconds'] / 60:.0f} min: **{'met' if m['target_met'] else 'not met'}**, "
        f"measured. Claims reproduced there: {m['reproduced'][0]} of {m['reproduced'][1]} "
        f"(here {claims_here[0]} of {claims_here[1]}); {same}.{moved}",
    ]


def _group_line(g: Mapping[str, Any]) -> str:
    if g["by"] == "invocation":
        head = (f"- invocation `{g['id']}` at {', '.join(f'`{c}`' for c in g['commits'])}: "
                f"{g['cells']} cells (one invocation)")
    else:
        head = (f"- commit `{g['id']}`: {g['cells']} cells (cells from separate runs at this "
                "commit; the span includes the time between them)")
    if g["span_minutes"] is None:
        span = "no measured span (no record keeps when its cell finished)"
    else:
        span = (f"measured span {g['span_minutes']:.1f} min ({_stamp(_parse(g['start']))} to "
                f"{_stamp(_parse(g['end']))}"
                + (f", over the {g['cells_with_time']} cells whose records keep when they finished"
                   if g["cells_with_time"] < g["cells"] else "") + ")")
    cpu = (f"Σ CPU {g['cpu_seconds']:,.0f} s" if g["cpu_seconds"] is not None
           else f"Σ CPU not known ({g['cells'] - g['cells_with_cpu']} of {g['cells']} records "
                "lack cpu_seconds)")
    load = ("1-minute load {:.2f} to {:.2f} at the cells' starts and ends".format(*g["load"])
            if g["load"] else "load not recorded")
    outside = (f"; {g['outside_run_seconds']:,.0f} s outside the runs (set-up, predictions, "
               f"hooks; {g['cells_with_start']} cells)" if g["outside_run_seconds"] is not None
               else "")
    return f"{head}: {span}; Σ wall {g['wall_seconds']:,.0f} s; {cpu}; {load}{outside}."


def paragraph(regen: Mapping[str, Any] | None) -> list[str]:
    """The page's "Regeneration" paragraph (empty for a results.json written before it)."""
    if not regen or not regen.get("cells"):
        return []
    n, workers = regen["cells"], regen["workers"]
    minutes = regen["estimate_seconds"] / 60
    if regen["estimate_from"] == "cpu_seconds":
        how = f"Σ CPU seconds / {workers} = {regen['cpu_seconds']:,.0f} s / {workers} = " \
              f"{minutes:.1f} min"
    else:
        how = (f"Σ wall seconds / {workers} = {regen['wall_seconds']:,.0f} s / {workers} = "
               f"{minutes:.1f} min, from wall times that move with the machine's load "
               f"({n - regen['cells_with_cpu']} of {n} records lack cpu_seconds)")
    verdict = "met" if regen["target_met"] else "not met"
    measured = [g for g in regen["groups"] if g["outside_run_seconds"] is not None]
    outside = (
        f"measured {sum(g['outside_run_seconds'] for g in measured):,.0f} s over the "
        f"{sum(g['cells_with_start'] for g in measured)} cells whose records keep `started_at`"
        if measured else "not measured: no record here keeps `started_at`"
    )
    return [
        f"Regeneration: the {n} cells this page reports (grid, bounds, sweeps), grouped by the "
        "invocation that ran them where their records say, else by commit. A span is measured "
        "(earliest start to latest finish; a record without `started_at` starts at its finish "
        "minus its wall time); Σ wall and Σ CPU are the cells' runs alone.",
        "",
        *[_group_line(g) for g in regen["groups"]],
        "",
        f"Estimated regeneration at {workers} workers on an idle machine: {how}. It assumes the "
        "cells pack evenly onto the workers and leaves out each cell's time outside its run "
        f"(set-up, predictions, hook; {outside}). Target ≤ {regen['target_seconds'] / 60:.0f} "
        f"min: {verdict} by this estimate, on the machine that ran the cells; this project's "
        "2-core machines differ by 2.9–3.3× on the same work (an AVX2-only Zen 3 against the "
        "earlier sessions' machine: the demo's training floor and a HierarchyFL cell, "
        "`benchmarks/overhead/ANALYSIS.md`, `benchmarks/hierarchyfl/regeneration_attempt.md`).",
    ]
