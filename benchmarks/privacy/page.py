"""The privacy page's measured diagnostics (results.md): what the noise does to each method's
uplink, read from the committed ``diagnose-*.json`` (``python -m benchmarks.privacy.diagnose``)
and ``mia.json``; no cell runs here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.privacy import felo_collapse

HERE = Path(__file__).parent


def _load(name: str) -> dict[str, Any] | None:
    path = HERE / name
    return json.loads(path.read_text()) if path.exists() else None


def _weights(title: str, table: dict[str, Any], how: str) -> list[str]:
    q = table["update_norm"]
    lines = [
        f"**{title}** ({table['devices']} devices, d = {table['d']:,} weights; round-0 update norm "
        f"‖Δ‖ p10 / median / p90 = {q['p10']:.3f} / {q['median']:.3f} / {q['p90']:.3f}; {how}):",
        "",
        "| C | ε | z | noise norm on the mean | signal ‖mean of clipped Δ‖ | noise / signal |",
        "|---|---|---|---|---|---|",
    ]
    for r in table["rows"]:
        lines.append(
            f"| {r['clip']:.3f} | {r['epsilon']:g} | {r['z']:.2f} | {r['noise_norm_on_mean']:.3g} "
            "| "
            f"{r['signal_norm']:.3f} | **{r['noise_to_signal']:.0f}** |"
        )
    return lines + [""]


def _stats(title: str, table: dict[str, Any]) -> list[str]:
    q = table["sample_norm"]
    lines = [
        f"**{title}**: per-sample statistics vector norm p10 / median / p90 = {q['p10']:.1f} / "
        f"{q['median']:.1f} / "
        f"{q['p90']:.1f} (round 0), C = {table['clip']:g}. Error ‖released − true‖ of a device's "
        "per-class mean "
        "(median over devices and classes, p90 in brackets), without and with the projection onto "
        "the C-ball:",
        "",
        "| ε | z | error, raw | error, projected | max softmax of the mean logits: true / raw / "
        "projected |",
        "|---|---|---|---|---|",
    ]
    for r in table["rows"]:
        peak = r.get("max_softmax")
        peaks = f"{peak['true']:.2f} / {peak['raw']:.2f} / {peak['projected']:.2f}" if peak else "—"
        lines.append(
            f"| {r['epsilon']:g} | {r['z']:.2f} | {r['error_raw']['median']:.1f} "
            f"({r['error_raw']['p90']:.1f}) | "
            f"{r['error_projected']['median']:.1f} ({r['error_projected']['p90']:.1f}) | {peaks} |"
        )
    return lines + [""]


def _validation(raw: dict[str, Any] | None, projected: dict[str, Any] | None) -> list[str]:
    if not (raw and projected):
        return []
    lines = [
        "**The projection on the validation split** (1,000 training images held out; the "
        "benchmark's fleet "
        "and rounds; seeds 0–1), validation accuracy % and collapsed devices, before the "
        "projection (raw: "
        "the same code with edgefl/privacy/mechanisms.py as before commit 8aabe9e, run from an "
        "export) and with "
        f"it (projected, at {projected['rows'][0]['code']}):",
        "",
        "| method | seed | raw | projected |",
        "|---|---|---|---|",
    ]
    by = {(r["method"], r["seed"]): r for r in raw["rows"]}
    for r in projected["rows"]:
        b = by.get((r["method"], r["seed"]))

        def cell(x):
            return "—" if x is None else f"{100 * x['validation_accuracy']:.1f}" + (
                f" ({'; '.join(x['collapsed'])})" if x["collapsed"] else "")
        lines.append(f"| {r['method']} | {r['seed']} | {cell(b)} | {cell(r)} |")
    return lines + [""]


def _accuracy(runs: list[dict[str, Any]], method: str,
              setting: str | None = None) -> tuple[float, float, int] | None:
    xs = [r["final_accuracy"] for r in runs
          if r["method"] == method and r["final_accuracy"] is not None
          and setting in (None, r["setting"])]
    if not xs:
        return None
    mean = sum(xs) / len(xs)
    sd = (sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5 if len(xs) > 1 else 0.0
    return 100 * mean, 100 * sd, len(xs)


def _stops(runs: list[dict[str, Any]], method: str) -> str:
    """The runs of ``method`` that stopped before their last round, each with the round and why
    (benchmarks/cells.py records them; "every device failed" is a collapse, a spent privacy budget
    a legitimate end)."""
    dp = [
        r for r in runs if r["method"].startswith(f"{method} ε=") and not r["method"].endswith("∞")
    ]
    stopped = sorted((r for r in dp if r.get("stopped_at_round")),
                     key=lambda r: (r["method"], r["seed"]))
    if not stopped:
        return ""
    return (
        f"{len(stopped)} of {len(dp)} DP runs stopped before their last round (their accuracy is "
        "that of their last evaluated round, in the means): "
        + "; ".join(
            f"{r['method'].partition(' ')[2]} seed {r['seed']} at round "
            f"{r['stopped_at_round']}, {r['stop_reason']}"
            for r in stopped
        )
    )


def verdicts(results: dict[str, Any]) -> str:
    """What holds and what does not, in sentences with the measured numbers (from the runs, the
    gates and the diagnostics; nothing here is typed in by hand)."""
    from benchmarks.privacy import SETTINGS

    runs = results.get("runs", [])
    collapsed = results.get("gates", {}).get("collapsed", {})
    fleet = _load("fleet.json")
    lines = ["## What holds and what does not", ""]
    bounds = results.get("bounds", {})
    if bounds:
        lines.append(
            "- Bounds: centralized "
            + ", Local-IID ".join(
                f"{100 * bounds[k]:.1f} %"
                for k in ("centralized", "local_iid")
                if bounds.get(k) is not None
            )
            + "; sanity gates "
            + (
                "pass."
                if not results["gates"]["failures"]
                else "fail: " + "; ".join(results["gates"]["failures"]) + "."
            )
        )
    for method in ("fedavg", "felo", "fedproto"):
        setting = SETTINGS[method]
        local = _accuracy(runs, "local", setting)
        parts, fallen = [], 0
        for eps in ("∞", "8", "4", "1"):
            acc = _accuracy(runs, f"{method} ε={eps}")
            if acc is None:
                continue
            n = sum(1 for k in collapsed if k.startswith(f"{method} ε={eps}|"))
            fallen += n if eps != "∞" else 0
            parts.append(
                f"ε={eps} {acc[0]:.1f} ± {acc[1]:.1f} %"
                + (f" ({n} of {acc[2]} runs collapsed)" if n else "")
            )
        stops = _stops(runs, method)
        if stops:
            parts.append(stops)
        if not parts:
            continue
        line = f"- **{method}**: " + ", ".join(parts)
        if local is not None:
            line += f"; Local (no uplink) {local[0]:.1f} ± {local[1]:.1f} %"
        dp = [
            a[0] for e in ("8", "4", "1") if (a := _accuracy(runs, f"{method} ε={e}")) is not None
        ]
        below = local is not None and dp and max(dp) < local[0]
        verdict = "stays below Local at every ε ≤ 8" if below else "measured"
        if method == "fedavg" and fleet:
            row = next(f for f in fleet["fleets"] if f["devices"] == 1000)
            ratios = {r["epsilon"]: r["noise_to_signal"] for r in row["rows"]}
            line += (
                f". **Central DP at 1,000 devices {verdict}**: the noise on the mean has norm "
                f"z·C·√d/n = {ratios[8.0]:.1f}× the mean clipped round-0 update at ε = 8 "
                f"({ratios[4.0]:.1f}× at ε = 4, {ratios[1.0]:.1f}× at ε = 1; fleet.md, validation "
                "split)"
            )
        if fallen and not (method == "fedavg" and fleet):
            line += f"; {fallen} DP run(s) collapsed"
        lines.append(line + ".")
    counted = [c for c in results.get("claims", []) if c.get("counted")]
    if counted:
        lines.append(
            "- Claims (ε = 8 above Local): "
            + "; ".join(f"{c['statement']}: **{c['verdict']}**" for c in counted)
            + "."
        )
    return "\n".join(lines) + "\n"


def diagnostics(results: dict[str, Any]) -> str:
    weights = _load("diagnose-fedavg.json") or {}
    feddw = _load("diagnose-feddw.json") or {}
    stats = _load("diagnose-stats.json") or {}
    fleet = HERE / "fleet.md"
    lines = [
        verdicts(results),
        *(["#" + fleet.read_text().replace("the update it protects", "the update it protects "
                                           "(fleet.md: the calculation that chose the fleet)", 1),
           ""] if fleet.exists() else []),
        "## Diagnostics: what the noise does to each uplink (measured, validation split)",
        "",
        "`python -m benchmarks.privacy.diagnose {fedavg,feddw,stats}` and `… diagnose validate "
        "{raw,projected}` "
        "(diagnose.py's docstring says what each measures). z: the noise multiplier that spends ε "
        "over the "
        "run's rounds at δ = 1e-5.",
        "",
    ]
    if "fedavg_10" in weights:  # the earlier 10-device fleet's, why it was replaced
        lines += _weights("DP-FedAvg, central (the earlier 10-device fleet)", weights["fedavg_10"],
                          "server noise std z·C/n per coordinate on the mean of n clipped updates")
    if "fedavg_100" in weights:
        lines += _weights(
            "DP-FedAvg, central, 100 devices of a 6,000-image Dir(0.5) split (the remedy: more "
            "devices per round)",
            weights["fedavg_100"],
            "the same, n = 100",
        )
    if "feddw_weights" in feddw:
        lines += _weights(
            "FedDW's weights under local DP (not run: fleet.md)",
            feddw["feddw_weights"],
            "each device adds std z·2C per coordinate; the mean of n carries z·2C·√d/√n",
        )
    for name, title in (
        ("felo", "Felo, local DP on [logits, features]"),
        ("fedproto", "FedProto, local DP on features"),
    ):
        if name in stats:
            lines += _stats(title, stats[name])
    lines += _validation(
        _load("diagnose-validate-raw.json"), _load("diagnose-validate-projected.json")
    )
    lines += _mia(_load("mia.json"))
    lines += felo_collapse.page(_load("felo_collapse.json"))
    return "\n".join(lines)


def _mia(mia: dict[str, Any] | None) -> list[str]:
    """The membership-inference section (mia.md): statistics uplinks and, when measured, the
    weight methods."""
    if not (mia and mia["rows"] and "method" in mia["rows"][0]):
        return []
    lines = [
        "## Membership inference at the same ε (mia.md)",
        "",
        "Statistics uplinks (Felo, FedProto; local DP): a white-box server scores each candidate "
        "image by the distance of its statistics vector to the uplinked mean of its class (one "
        "release of a device of about 60 images; 20 devices × 3 seeds; chance 0.5; "
        f"`python -m benchmarks.privacy.mia`, at {mia.get('code', '—')}).",
        "",
        "| method | attacked | ε | attack AUC (mean ± sd) | over | largest |",
        "|---|---|---|---|---|---|",
    ]
    lines += [f"| {r['method']} | per-class statistics uplink | {r['epsilon']} | "
              f"{r['auc_mean']:.3f} ± {r['auc_sd']:.3f} | {r['devices']} devices | "
              f"{r['auc_max']:.3f} |" for r in mia["rows"]]
    weights = mia.get("weight_methods")
    if weights:
        lines += [f"| {r['method']} | {r['target']} | {r['epsilon']} | {r['auc_mean']:.3f} ± "
                  f"{r['auc_sd']:.3f} | {r['n']} {r['over']} | {r['auc_max']:.3f} |"
                  for r in weights["rows"]]
        lines += ["", "Weight methods: loss threshold (Yeom et al.; −cross-entropy of the "
                  "candidate under the attacked model) on the same fleet: FedAvg's released "
                  f"global model after {weights['fedavg_rounds']} rounds (central DP), FedDW's "
                  "device uplink after one local epoch (local DP); "
                  f"`python -m benchmarks.privacy.mia_weights`, at {weights.get('code', '—')}."]
    else:
        lines += ["", "The weight methods (FedAvg, FedDW) are not attacked."]
    return lines + [""]
