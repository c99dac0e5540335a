"""The privacy page's measured diagnostics (results.md): what the noise does to each method's
uplink, read from the committed ``diagnose-*.json`` (``python -m benchmarks.privacy.diagnose``)
and ``mia.json``; no cell runs here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent


def _load(name: str) -> dict[str, Any] | None:
    path = HERE / name
    return json.loads(path.read_text()) if path.exists() else None


def _weights(title: str, table: dict[str, Any], how: str) -> list[str]:
    q = table["update_norm"]
    lines = [f"**{title}** ({table['devices']} devices, d = {table['d']:,} weights; round-0 update norm "
             f"‖Δ‖ p10 / median / p90 = {q['p10']:.3f} / {q['median']:.3f} / {q['p90']:.3f}; {how}):", "",
             "| C | ε | z | noise norm on the mean | signal ‖mean of clipped Δ‖ | noise / signal |",
             "|---|---|---|---|---|---|"]
    for r in table["rows"]:
        lines.append(f"| {r['clip']:.3f} | {r['epsilon']:g} | {r['z']:.2f} | {r['noise_norm_on_mean']:.3g} | "
                     f"{r['signal_norm']:.3f} | **{r['noise_to_signal']:.0f}** |")
    return lines + [""]


def _stats(title: str, table: dict[str, Any]) -> list[str]:
    q = table["sample_norm"]
    lines = [f"**{title}**: per-sample statistics vector norm p10 / median / p90 = {q['p10']:.1f} / {q['median']:.1f} / "
             f"{q['p90']:.1f} (round 0), C = {table['clip']:g}. Error ‖released − true‖ of a device's per-class mean "
             "(median over devices and classes, p90 in brackets), without and with the projection onto the C-ball:", "",
             "| ε | z | error, raw | error, projected | max softmax of the mean logits: true / raw / projected |",
             "|---|---|---|---|---|"]
    for r in table["rows"]:
        peak = r.get("max_softmax")
        peaks = f"{peak['true']:.2f} / {peak['raw']:.2f} / {peak['projected']:.2f}" if peak else "—"
        lines.append(f"| {r['epsilon']:g} | {r['z']:.2f} | {r['error_raw']['median']:.1f} ({r['error_raw']['p90']:.1f}) | "
                     f"{r['error_projected']['median']:.1f} ({r['error_projected']['p90']:.1f}) | {peaks} |")
    return lines + [""]


def _validation(raw: dict[str, Any] | None, projected: dict[str, Any] | None) -> list[str]:
    if not (raw and projected):
        return []
    lines = ["**The projection on the validation split** (1,000 training images held out; the benchmark's fleet "
             "and rounds; seeds 0–1), validation accuracy % and collapsed runs, before (raw, the code at "
             f"{raw['rows'][0]['code']}) and after (projected, {projected['rows'][0]['code']}):", "",
             "| method | seed | raw | projected |", "|---|---|---|---|"]
    by = {(r["method"], r["seed"]): r for r in raw["rows"]}
    for r in projected["rows"]:
        b = by.get((r["method"], r["seed"]))

        def cell(x):
            return "—" if x is None else f"{100 * x['validation_accuracy']:.1f}" + (
                f" ({'; '.join(x['collapsed'])})" if x["collapsed"] else "")
        lines.append(f"| {r['method']} | {r['seed']} | {cell(b)} | {cell(r)} |")
    return lines + [""]


def diagnostics(results: dict[str, Any]) -> str:
    weights = _load("diagnose-fedavg.json") or {}
    feddw = _load("diagnose-feddw.json") or {}
    stats = _load("diagnose-stats.json") or {}
    lines = ["## Diagnostics: what the noise does to each uplink (measured, validation split)", "",
             "`python -m benchmarks.privacy.diagnose {fedavg,feddw,stats}` and `… diagnose validate {raw,projected}` "
             "(diagnose.py's docstring says what each measures). z: the noise multiplier that spends ε over the "
             "run's rounds at δ = 1e-5.", ""]
    if "fedavg_10" in weights:
        lines += _weights("DP-FedAvg, central", weights["fedavg_10"],
                          "server noise std z·C/n per coordinate on the mean of n clipped updates")
    if "fedavg_100" in weights:
        lines += _weights("DP-FedAvg, central, 100 devices of a 6,000-image Dir(0.5) split (the remedy: more "
                          "devices per round)", weights["fedavg_100"], "the same, n = 100")
    if "feddw_weights" in feddw:
        lines += _weights("FedDW's weights under local DP", feddw["feddw_weights"],
                          "each device adds std z·2C per coordinate; the mean of n carries z·2C·√d/√n")
    for name, title in (("felo", "Felo, local DP on [logits, features]"), ("fedproto", "FedProto, local DP on features")):
        if name in stats:
            lines += _stats(title, stats[name])
    lines += _validation(_load("diagnose-validate-raw.json"), _load("diagnose-validate-projected.json"))
    return "\n".join(lines)
