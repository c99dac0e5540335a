"""``benchmarks/README.md``, the index the runner writes over every benchmark: one line per paper
(claims reproduced: k of n, the gates), then every claim with its kind and verdict, read from the
committed ``results.json`` files (a benchmark declared on the runner but not yet run: its claims
as declared)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

from benchmarks.cells import BENCHMARKS
from benchmarks.claims import KINDS, metric_scale
from benchmarks.pages import VOCABULARY, alone, counts


def _metric_label(metric_a: str, metric_b: str) -> str:
    unit = " (points)" if metric_scale(metric_a) == 100 else ""
    return (f"`{metric_a}`" if metric_a == metric_b else f"`{metric_a}` vs `{metric_b}`") + unit


def estimate(regen: dict | None) -> str:
    """The index's words for a page's estimated regeneration ("" before pages carried one)."""
    if not regen or not regen.get("cells"):
        return ""
    source = "CPU" if regen["estimate_from"] == "cpu_seconds" else "wall"
    m = regen.get("measured")
    done = ""
    if m:  # the page's own cells (folder None) or a regeneration kept beside it
        own = m.get("folder") is None
        read = m.get("sweeps_read")
        whose = "Its grid and bounds ran" if read else "Its cells ran"
        done = (f" {whose + ' in one invocation' if own else 'Regenerated in one run'} in "
                f"{m['span_minutes']:.0f} min, measured on {m['cores']} cores (target ≤ "
                f"{m['target_seconds'] / 60:.0f} min {'met' if m['target_met'] else 'not met'}"
                + ("" if own else f"; claims reproduced there {m['reproduced'][0]} of "
                   f"{m['reproduced'][1]}") + ")"
                + (f"; its {read['cells']} sweep cells are read from earlier runs (about "
                   f"{read['estimate_seconds'] / 60:.0f} min more if rerun)" if read else "")
                + ".")
    q = regen.get("quick")
    quick = (f" Quick profile measured in {q['span_minutes']:.1f} min (target ≤ "
             f"{q['target_seconds'] / 60:.0f} min {'met' if q['target_met'] else 'not met'}), "
             f"signs agreeing for {q['agree']} of {len(q['rows'])} counted claims compared."
             if q else "")
    return done + quick + (f" Regeneration at {regen['workers']} workers estimated at "
            f"{regen['estimate_seconds'] / 60:.0f} min (Σ {source} seconds / {regen['workers']}; "
            f"target ≤ {regen['target_seconds'] / 60:.0f} min "
            f"{'met' if regen['target_met'] else 'not met'}).")


def write_readme_index(root: Path = BENCHMARKS) -> Path:
    """benchmarks/README.md: one line per paper (claims reproduced: k of n, the gates), then every
    row with its kind and verdict, from the committed results."""
    head, rows, others, declared = [], [], [], []
    for d in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("_")):
        f = d / "results.json"
        data = json.loads(f.read_text()) if f.exists() else {}
        if (
            "claims" not in data
            or not isinstance(data.get("runs"), list)
            or not data["runs"]
            or "final_accuracy" not in data["runs"][0]
        ):
            main_py = d / "__main__.py"
            (
                declared
                if main_py.exists() and "benchmarks.runner" in main_py.read_text()
                else others
            ).append(d.name)
            continue
        k, n = counts(data["claims"])
        gate = data.get("gates") or {}
        fails = len(gate.get("failures", []))
        state = "sanity gates FAIL: " + "; ".join(gate["failures"]) if fails else "bounds pass"
        if data.get("missing"):
            state = f"incomplete run ({len(data['missing'])} cells missing); {state}"
        collapsed = len(gate.get("collapsed", {}))
        head.append(
            f"- **{data.get('paper') or data.get('title', d.name)}** "
            f"([{d.name}]({d.name}/results.md)): "
            f"claims reproduced: {k} of {n}"
            + (f" ({alone(data['claims'])[2:]})" if alone(data["claims"]) else "")
            + f". {state[0].upper()}{state[1:]}; "
            f"{collapsed} collapsed run(s)." + estimate(data.get("regeneration"))
        )
        for c in data["claims"]:
            md = (
                "—"
                if c["mean_diff"] is None
                else f"{metric_scale(c['metric_a']) * c['mean_diff']:+.2f}"
            )
            kind = KINDS.get(c.get("kind", "paper"), "")
            counted = "yes" if c.get("counted") else "no"
            rows.append(
                f"| [{d.name}]({d.name}/results.md) | `{c['statement']}` | {c['setting']} | "
                f"{_metric_label(c['metric_a'], c['metric_b'])} | {kind} | {counted} | "
                f"{c.get('paper') or '—'} | "
                f"{c['verdict']} | {c.get('statistic') or '—'} | {md} | {len(c['seeds'])} |"
            )
    for name in declared:  # their claims, as declared, until a full run commits results
        for c in importlib.import_module(f"benchmarks.{name}").make(False).claims:
            rows.append(
                f"| [{name}]({name}/__init__.py) | `{c.statement}` | {c.setting} | "
                f"{_metric_label(c.metric_a or c.metric, c.metric_b or c.metric)} | "
                f"{KINDS[c.kind]} | — | "
                f"{c.paper or '—'} | not yet run | — | — | — |"
            )
    lines = [
        "# Benchmarks",
        "",
        *head,
        "",
        "Generated by `benchmarks/runner.py` from the committed `results.json` files; the "
        "protocol is "
        "`../shared/specs/BENCHMARKS.md`. "
        + VOCABULARY
        + ' "Counted": the paper\'s claims and the controls over a '
        "benchmark's declared main settings (its `declared.json`); rows the paper implies (every "
        "method against "
        "Local and FedAvg), non-inferiority rows and rows true by construction are shown, not "
        "counted. Rerun a "
        "benchmark with `python -m benchmarks.<name>` (`--quick` for the small profile; "
        "`--settings S1,S2` reruns those settings alone, the others read from the cache); check "
        "chosen cells with "
        "seeds of your own with `python -m benchmarks.<name> --cells A,B --setting S --seeds "
        "101,102,103 --out DIR` "
        '(each page\'s "Check it yourself"; quote a method name that holds a space: '
        "`--cells 'local,fedavg ε=∞'`).",
        "",
        "| benchmark | claim | setting | metric | kind | counted | the paper's number | verdict | "
        "the numbers alone | mean diff | seeds |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
    ]
    if declared:
        lines += [
            "",
            "Declared on the runner but not yet run under the protocol (no committed results; "
            "earlier, "
            "pre-protocol results, where there were any, are under the benchmark's `previous/`): "
            + ", ".join(f"[{n}]({n}/__init__.py) (`python -m benchmarks.{n}`)" for n in declared)
            + ".",
        ]
    if others:
        lines += [
            "",
            "Not under the protocol (timing, transport and demo measurements; their own pages "
            "describe "
            "what they measured and how): " + ", ".join(f"[{n}]({n}/)" for n in others) + ".",
        ]
    out = root / "README.md"
    out.write_text("\n".join(lines) + "\n")
    return out
