"""The page the runner writes for a benchmark: its ``results.md`` (``benchmarks/README.md``, the
index over every benchmark, is :mod:`benchmarks.index`'s).

Both open with what a reviewer asks first: how many of the paper's claims are reproduced, whether
the runs pass the sanity gates, and where the cells come from. Every verdict is computed by
:func:`benchmarks.claims.evaluate_claim`; nothing here judges, it only lays out.
"""

from __future__ import annotations

import json
import math
import shlex
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks import provenance
from benchmarks.cells import BENCHMARKS
from benchmarks.claims import COUNTED, KINDS, SLOPE_LIMIT, mean_sd, metric_scale
from benchmarks.regeneration import measured_paragraph, paragraph, quick_paragraph

if TYPE_CHECKING:
    from benchmarks.runner import Benchmark

VOCABULARY = (
    "**reproduced**: the mean paired difference beyond 2 sd the claimed way and every seed "
    "agreeing; "
    "**not reproduced**: short of that (the measured numbers beside it); **reversed**: the same, "
    "the other "
    "way; **not comparable**: the runs cannot answer (fewer than 3 seeds, a compared method's "
    "last-quarter "
    f"slope at or above {SLOPE_LIMIT} points per 10 % of rounds (over the per-round evaluations "
    "alone, never the final one on the larger test split), collapsed runs, failed sanity "
    "gates; the "
    'reason beside it, and what the numbers alone say). A "not worse than" row (mean above −1 sd) '
    "is a "
    "non-inferiority check and never counts as reproducing a claim of improvement."
)


def pct(x: float | None, sd: float | None = None) -> str:
    """A fraction in points with two decimals (± sd where given); "—" for none."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{100 * x:.2f}" + (
        f" ± {100 * sd:.2f}" if sd is not None and not math.isnan(sd) else ""
    )


def runs_table(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The runs table of results.md: per setting, per method, mean ± sd over seeds."""
    settings = list(dict.fromkeys(r["setting"] for r in runs))
    lines = []
    for setting in settings:
        rs = [r for r in runs if r["setting"] == setting]
        tiers = list(dict.fromkeys(t for r in rs for t in r["per_tier"]))
        lines += [
            f"### {setting}",
            "",
            "| method | seeds | final acc % | "
            + " | ".join(f"tier {t}" for t in tiers)
            + " | slope | up B/dev-round | down B/dev-round | wall s |",
            "|---|---|---|" + "---|" * len(tiers) + "---|---|---|---|",
        ]
        for method in dict.fromkeys(r["method"] for r in rs):
            mr = [r for r in rs if r["method"] == method]
            acc = mean_sd([r["final_accuracy"] for r in mr])
            tier_cells = [pct(*mean_sd([r["per_tier"].get(t) for r in mr])) for t in tiers]
            slope = mean_sd([r["slope"] for r in mr])[0]
            stopped = [r for r in mr if r.get("stopped_at_round")]
            name = f"{method} ({len(stopped)} stopped)" if stopped else method
            lines.append(
                f"| {name} | {len(mr)} | {pct(*acc)} | "
                + " | ".join(tier_cells)
                + f" | {slope:.2f} | "
                f"{statistics.fmean(r['bytes_up_per_device_round'] for r in mr):,.0f}"
                + f" | {statistics.fmean(r['bytes_down_per_device_round'] for r in mr):,.0f}"
                + f" | {statistics.fmean(r['wall_seconds'] for r in mr):.0f} |"
            )
        if any(r.get("stopped_at_round") for r in rs):
            lines += ["", "*stopped*: runs that ended before their last round, with their last "
                      "evaluated accuracy (the round and why: `stopped_at_round`, `stop_reason` in "
                      "results.json). Every device failing a round is a collapse (the gates list "
                      "it); every device's privacy budget spent is a legitimate end, its accuracy "
                      "what the fleet has at that point."]
        lines.append("")
    return lines


def is_counted(claim: Mapping[str, Any]) -> bool:
    """Whether a claim counts toward "claims reproduced: k of n" (a results.json written before
    claims carried ``counted`` counts the paper's claims and the controls)."""
    return claim.get("counted", claim.get("kind", "paper") in COUNTED)


def counts(claims: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    counted = [c for c in claims if is_counted(c)]
    return sum(c["verdict"] == "reproduced" for c in counted), len(counted)


def alone(claims: Sequence[Mapping[str, Any]]) -> str:
    """How many counted claims the paired differences alone would reproduce, when the gates,
    collapsed runs or convergence make some not comparable ("" when nothing is)."""
    counted = [c for c in claims if is_counted(c)]
    if not any(c["verdict"] == "not comparable" and c.get("statistic") for c in counted):
        return ""
    return (f"; by the paired differences alone, whatever makes them not comparable: "
            f"{sum(c.get('statistic') == 'reproduced' for c in counted)} of {len(counted)}")


def _short_reason(c: Mapping[str, Any]) -> str:
    if c["verdict"] != "not comparable" or c.get("statistic") is None:
        return c.get("reason", "")
    parts = []
    for part in c["reason"].split(" (the numbers alone")[0].split(" | "):
        if part.startswith("the benchmark fails its sanity gates"):
            parts.append("sanity gates fail (above)")
        elif part.startswith("collapsed runs"):
            parts.append(
                "collapsed runs: "
                + ", ".join(x.split(" (")[0] for x in c.get("collapsed_runs", []))
                + " (above)"
            )
        else:
            parts.append(part)
    return "; ".join(parts) + f"; the numbers alone: {c['statistic']}"


def claims_table(claims: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = [
        "| claim | setting | metric | the paper's number | mean diff | sd | signs per seed | "
        "method slope | verdict | why |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in claims:
        scale = metric_scale(c["metric_a"])
        md = "—" if c["mean_diff"] is None else f"{scale * c['mean_diff']:+.2f}"
        sd = "—" if c["sd"] is None else f"{scale * c['sd']:.2f}"
        signs = " ".join("+" if s > 0 else "−" if s < 0 else "0" for s in c["signs"])
        slope = "—" if c.get("method_slope") is None else f"{c['method_slope']:.2f}"
        metric = (
            c["metric"] if c["metric_a"] == c["metric_b"] else f"{c['metric_a']} vs {c['metric_b']}"
        )
        marks = " †" if c.get("before_declaration") else ""
        note = f" {c['note']}" if c.get("note") else ""
        statement = (
            c["statement"].replace(" ≥ ", " not worse than ").replace(" ≤ ", " not better than ")
            if c.get("kind") == "not worse"
            else c["statement"]
        )
        lines.append(
            f"| `{statement}`{marks} | {c['setting']} | {metric} | {c.get('paper') or '—'} | {md} "
            f"| {sd} | {signs} | "
            f"{slope} | **{c['verdict']}** | {_short_reason(c)}.{note} |"
        )
    return lines


def gates_section(results: Mapping[str, Any]) -> list[str]:
    gate = results.get("gates") or {"failures": [], "collapsed": {}}
    lines = ["## Sanity gates", ""]
    if gate["failures"]:
        lines += [
            "**FAIL.** "
            + " ".join(f"{f[0].upper()}{f[1:]}." for f in gate["failures"])
            + " Until the recipe is fixed every claim below is **not comparable** (the numbers "
            "alone are shown beside it).",
            "",
        ]
    else:
        lines += [
            "Bounds: pass (the centralized bound is above every federated method and Local-IID "
            "beyond the noise; "
            "Local-IID reaches 75 %).",
            "",
        ]
    collapsed = gate["collapsed"]
    if collapsed:
        by: dict[tuple[str, str], list[str]] = {}
        for rid, reasons in collapsed.items():
            method, setting, seed = rid.split("|")
            by.setdefault((method, setting), []).append(f"seed {seed}: {'; '.join(reasons)}")
        lines += [
            f"**Collapsed runs: {len(collapsed)}** (a run within 5 points of chance, or a device "
            "predicting one class "
            "while its training data holds two or more, each ≥ 10 % of its images; *proxy*: read "
            "from the device's "
            "accuracy, at most 3 points above what a single-class predictor scores on the "
            "class-balanced test set — "
            "and, where the run measured it, on its local split — because these cells were cached "
            "before the runner "
            "recorded each device's predictions). A claim over a collapsed run is not comparable.",
            "",
            "| method | setting | runs |",
            "|---|---|---|",
        ]
        lines += [f"| {m} | {s} | {'<br>'.join(v)} |" for (m, s), v in by.items()]
        lines.append("")
    else:
        lines += ["Collapsed runs: none.", ""]
    return lines


def provenance_section(bench: Benchmark, results: Mapping[str, Any]) -> list[str]:
    prov = results.get("provenance") or {}
    commits = prov.get("commits", {})
    cells = prov.get("cells", {})
    lines = [
        "## Provenance",
        "",
        "Cells by the commit they ran at (`+dirty`: the working tree differed from it): "
        + ", ".join(f"`{k}` ({v})" for k, v in sorted(commits.items(), key=lambda kv: -kv[1]))
        + ".",
        "",
    ]
    pre = cells.get(provenance.PRE_PROVENANCE, 0)
    dirty = sum(v for k, v in commits.items() if provenance.is_dirty(k))
    lines.append(
        "Code: the hash of the code a cell runs (the `edgefl` package and the benchmark's module "
        "that runs in "
        f"the cell) is `{results.get('code_hash')}` at `{results.get('code')}`. "
        + ", ".join(f"{v} cell(s): {k}" for k, v in cells.items())
        + ". "
        + (
            f"The {pre} pre-provenance cells were cached before the runner keyed cells by the "
            "code's hash: they "
            f"stay usable for this page (their commits above are read from their records, {dirty} "
            "of the "
            f"{sum(commits.values())} cells at a `+dirty` tree; the runner then counted any "
            "change under `benchmarks/`, the "
            "cells being written included, as dirty, so there `+dirty` does not tell whether the "
            "code differed), "
            "and a run never reuses them: a regeneration reruns every one of them."
            if pre
            else ""
        )
    )
    regen = paragraph(results.get("regeneration"))
    lines += ["", *regen] if regen else []
    done = measured_paragraph((results.get("regeneration") or {}).get("measured"),
                              counts(results.get("claims", [])))
    lines += ["", *done] if done else []
    quick = quick_paragraph((results.get("regeneration") or {}).get("quick"))
    lines += ["", *quick] if quick else []
    decl = prov.get("declaration")
    lines.append("")
    if decl:
        at = decl.get("declared_at")
        lines.append(
            "Settings declared in [`declared.json`](declared.json) "
            + (f"at commit `{at}`" if at else "(not committed yet)")
            + f": main {', '.join(decl.get('main') or [])}"
            + (
                f"; alternatives {', '.join(decl['alternatives'])}"
                if decl.get("alternatives")
                else ""
            )
            + ". Only claims over main settings are counted. † marks a claim whose cells were "
            "produced at a commit "
            "that does not contain that declaration (here: every cell run before the declaration "
            "existed)."
        )
        lines[-1] += setting_dates(decl)
        if decl.get("note"):
            lines[-1] += f" {decl['note']}"
        for name, text in (decl.get("settings") or {}).items():
            lines += ["", f"Setting `{name}`: {text}"]
    else:
        lines.append(
            "No `declared.json`: the benchmark's settings are not declared apart from its code."
        )
    return lines + [""]


def setting_dates(decl: Mapping[str, Any]) -> str:
    """Where a setting's own declaration (its entry under ``settings``) dates it apart from the
    file: each setting and the commit of its declaration ('' when they all share the file's)."""
    at, by = decl.get("declared_at"), decl.get("declared_at_by_setting") or {}
    if not decl.get("settings") or not at:
        return ""
    dated = ", ".join(f"{name} at `{when}`" for name, when in by.items())
    return (f" Each setting is dated by its own declaration (a setting's entry under `settings`, "
            f"with the shared part; a change to one entry declares that setting alone again): "
            f"{dated}.")


def check_command(name: str, methods: Sequence[str], setting: str) -> str:
    """The reviewer's check as a shell line: method names such as ``fedavg ε=∞`` hold spaces,
    so each argument is quoted where the shell needs it."""
    return shlex.join(["python", "-m", f"benchmarks.{name}", "--cells", ",".join(methods),
                       "--setting", setting, "--seeds", "101,102,103", "--out", "DIR"])


def reviewer_section(bench: Benchmark) -> list[str]:
    methods = list(dict.fromkeys(c.method for c in bench.cells))
    setting = bench.cells[0].setting if bench.cells else "SETTING"
    return [
        "## Check it yourself",
        "",
        "Rerun chosen cells with seeds of your choosing, from any directory, into a folder of "
        "your own (the committed "
        "cells are not touched; progress per round; temporary files under the folder; the verdict "
        "of every claim "
        "between the chosen methods in that setting at the end, also in `check.json`):",
        "",
        "    " + check_command(bench.name, methods[:2], setting),
        "",
        "(from outside the repository: "
        f"`PYTHONPATH=/path/to/repo python -m benchmarks.{bench.name} …`; "
        "add `--quick` for the small profile, `--draft` to run from uncommitted code)."
        + (
            " One such check, run and committed: [check-quick/](check-quick/README.md)."
            if (BENCHMARKS / bench.name / "check-quick" / "README.md").exists()
            else ""
        ),
        "",
    ]


def results_markdown(bench: Benchmark, results: Mapping[str, Any], figures: str = "") -> str:
    claims = results["claims"]
    kinds = {k: [c for c in claims if c.get("kind", "paper") == k] for k in KINDS}
    counted = [c for c in claims if is_counted(c)]
    uncounted_main = [c for c in kinds["paper"] + kinds["control"] if not is_counted(c)]
    k, n = counts(claims)
    ik = sum(c["verdict"] == "reproduced" for c in kinds["implied"])
    m0, m1 = results["machine"]["before"], results["machine"]["after"]
    lines = [
        f"# {bench.title}",
        "",
        f"Paper: {bench.paper or '—'}. **Claims reproduced: {k} of {n}** (the paper's claims and "
        "the controls, "
        f"over the main settings{alone(claims)}); rows the paper implies reproduced: {ik} of "
        f"{len(kinds['implied'])}. Evaluated by "
        "`benchmarks/runner.py` from the runs in `results.json`. " + VOCABULARY,
        "",
    ]
    if results.get("missing"):
        lines += [f"**Incomplete: {len(results['missing'])} cells of the declared grid did not "
                  "run** (the run was stopped before its end); everything below is over the "
                  "cells that finished, and a claim short of its seeds reads \"not comparable\". "
                  "Missing: " + ", ".join(f"`{x}`" for x in results["missing"])
                  + ". `--missing-only` runs them.", ""]
    lines += gates_section(results)
    lines += ["## The paper's claims and the controls", ""] + claims_table(counted) + [""]
    if uncounted_main:
        lines += (
            ["Over settings declared as alternatives (not counted):", ""]
            + claims_table(uncounted_main)
            + [""]
        )
    sections = (
        (
            "implied",
            "## Rows the paper implies (every method against Local and against FedAvg, where "
            "defined)",
        ),
        ("not worse", "## Not worse than (non-inferiority checks; never counted as a claim)"),
        ("construction", "## True by construction (shown; nothing to reproduce)"),
        ("diagnostic", "## Diagnostic rows (measured explanations; not counted)"),
    )
    for kind, title in sections:
        if kinds[kind]:
            lines += [title, ""] + claims_table(kinds[kind]) + [""]
    lines += provenance_section(bench, results) + reviewer_section(bench)
    lines += [
        "## Setting",
        "",
        bench.description.strip(),
        "",
        f"Command: `{results['command']}`  ",
        (f"Machine: {m0.get('cores')} cores, load (1/5/15 min) {m0.get('loadavg_1_5_15')} at the "
         f"start ({m0.get('date')}), {m1.get('loadavg_1_5_15')} at the end ({m1.get('date')}). "
         if m0.get("loadavg_1_5_15") else
         f"Machine: {m0.get('cores')} cores ({m0.get('cpu')}); this report was rewritten from "
         "cells of a run whose machine block it does not have: that run's loads, from its cells' "
         "records, are under Provenance. ")
        + "Cells run one torch thread each, one cell per core; wall times are per cell and rough "
        "on a shared machine.",
        "",
    ]
    if results["bounds"]:
        lines += ["## Bounds", ""]
        for name in bench.bounds:
            rs = results["bound_runs"][name]
            a, s = mean_sd([r["final_accuracy"] for r in rs])
            desc = ", ".join(sorted({f"{r['method']} in {r['setting']}" for r in rs}))
            lines.append(f"- **{name}**: {pct(a, s)} % ({desc}; {len(rs)} run(s))")
        lines.append("")
    lines += ["## Runs (test set; mean ± sd over seeds)", ""] + runs_table(results["runs"])
    if results.get("derived_runs"):
        lines += [
            "## Paired differences (derived from the runs above, paired by seed)",
            "",
            "| difference | setting | from | seeds | final acc (points) | per tier (points) |",
            "|---|---|---|---|---|---|",
        ]
        derived = results["derived_runs"]
        for key in dict.fromkeys((r["method"], r["setting"]) for r in derived):
            rs = [r for r in derived if (r["method"], r["setting"]) == key]
            a, b, setting = rs[0]["derived_from"]
            tiers = list(dict.fromkeys(t for r in rs for t in r["per_tier"]))
            per_tier = ", ".join(
                f"{t}: {pct(*mean_sd([r['per_tier'].get(t) for r in rs]))}" for t in tiers
            )
            lines.append(f"| {key[0]} | {key[1]} | {a} − {b} in {setting} | {len(rs)} | "
                         f"{pct(*mean_sd([r.get('final_accuracy') for r in rs]))} | {per_tier} |")
        lines.append("")
    if results["sweeps"]:
        lines += [
            "## Sweeps (validation split carved from the training data; the test set is never "
            "used)",
            "",
        ]
        lines += [sweep_line(s) for s in results["sweeps"]]
        lines.append("")
    if bench.diagnostics is not None:
        lines += [bench.diagnostics(results).strip(), ""]
    lines += ["## Figures", ""] + ([
        "![accuracy per round](accuracy.png)",
        "",
        "![accuracy vs bytes](accuracy_bytes.png)",
        "",
    ] if results["runs"] else ["No run of the grid has finished yet.", ""])
    if figures.strip():
        lines += [figures.strip(), ""]
    return "\n".join(lines)


def sweep_line(s: Mapping[str, Any]) -> str:
    """A sweep's line: its values, what it chose, and whether that is the value the grid runs."""
    vals = ", ".join(f"{v}: {pct(a, sd)}" for v, a, sd in zip(
        s["grid"], s["validation_accuracy"], s["validation_sd"], strict=True))
    chosen = (f"chosen **{s['chosen']}**" if s["chosen"] is not None
              else f"metric missing ({s.get('missing', '')})")
    if s.get("kept_default"):
        chosen += f" (the default: the best, {s['best']}, is within the noise of it)"
    elif s.get("default") is not None and s["chosen"] not in (None, s["default"]):
        chosen += (f" — **not the default {s['default']} the grid runs**: this page's claims "
                   "are over a value the sweep did not choose until the grid reruns at it")
    return (f"- **{s['parameter']}** by `{s['metric']}` (seeds {s['seeds']}): {vals} → {chosen}. "
            f"{s['note']}")


def signs(claim: Mapping[str, Any]) -> str:
    """A claim's paired differences' signs per seed: "+ + −"."""
    return " ".join("+" if s > 0 else "−" if s < 0 else "0" for s in claim["signs"])


def against_previous(results: Mapping[str, Any], previous: Path, heading: str,
                     earlier: str) -> list[str]:
    """Each claim's mean paired difference here against an earlier profile's committed
    ``results.json`` (``previous``; ``earlier`` says what that profile was): whether the sign
    survives the change of profile. Nothing when that file is not there."""
    if not previous.exists():
        return []
    old = json.loads(previous.read_text())
    before = {(c["id"], c["kind"]): c for c in old["claims"]}
    rows, kept = [], {"paper": [0, 0], "control": [0, 0], "implied": [0, 0]}
    clear = [0, 0]  # of the claims whose earlier difference was beyond 2 sd, every seed agreeing
    for c in results["claims"]:
        o = before.get((c["id"], c["kind"]))
        if c["kind"] not in kept or o is None or c["mean_diff"] is None or o["mean_diff"] is None:
            continue
        same = (c["mean_diff"] > 0) == (o["mean_diff"] > 0)
        kept[c["kind"]][0] += same
        kept[c["kind"]][1] += 1
        if abs(o["mean_diff"]) > 2 * o["sd"] and len({x > 0 for x in o["signs"]}) == 1:
            clear[0] += same
            clear[1] += 1
        a, b = c.get("metric_a") or "final_accuracy", c.get("metric_b") or c.get("metric_a")
        metric = "" if a == "final_accuracy" else f" `{a}`" + (f" vs `{b}`" if b and b != a else "")
        rows.append(f"| `{c['statement']}` | {c['setting']}{metric} | {c['kind']} | "
                    f"{100 * o['mean_diff']:+.2f} ± {100 * o['sd']:.2f} ({signs(o)}) | "
                    f"{100 * c['mean_diff']:+.2f} ± {100 * c['sd']:.2f} ({signs(c)}) | "
                    f"{'yes' if same else '**no**'} | {c['verdict']} |")
    bounds = ", ".join(f"{k} {100 * old['bounds'][k]:.1f} % → {100 * v:.1f} %"
                       for k, v in results["bounds"].items() if old["bounds"].get(k) is not None)
    return [
        heading,
        "",
        earlier + " against this run, claim by claim: the mean paired difference ± sd (points) "
        "and the sign per seed. Bounds: " + bounds + ". Signs kept: "
        + "; ".join(f"{k} {a} of {n}" for k, (a, n) in kept.items() if n)
        + f"; of those whose earlier difference was beyond 2 sd with every seed agreeing, "
        f"{clear[0]} of {clear[1]} (the others' earlier sign was within the noise).",
        "",
        "| claim | setting | kind | earlier profile | this run | sign kept | verdict here |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ]
