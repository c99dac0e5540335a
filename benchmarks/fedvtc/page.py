"""The FedVTC page's own sections (results.md): what the claims turn on, FedVTC against Local term
by term, where the earlier ten-device grid lost to Local, tc_sweep.md's verdict, and the figure of
the synthetic samples each setting's seed-0 run recorded. Read from the results and the committed
files at report time; nothing here runs in a cell."""

from __future__ import annotations

import base64
import json
import statistics
from pathlib import Path

#: the earlier grid's five tiers (``ten_devices/``, two devices each)
TIERS = ("1", "2", "3", "4", "5")


def below_local(runs: list[dict]) -> list[str]:
    """FedVTC − Local per setting, as a sum of measured differences (each paired by seed): the
    fine-tune (after − before), FedVTC's training against FedProto's after the same rounds of real
    data (FedVTC before its fine-tune − FedProto at round R), FedProto's 𝒯 extra rounds (at R −
    final) and FedProto − Local. The terms add up to FedVTC − Local exactly."""
    by = {(r["setting"], r["method"], r["seed"]): r for r in runs if r.get("role") == "grid"}
    names = ("fine-tune", "FedVTC's training vs FedProto's", "FedProto at R − final",
             "FedProto − Local")
    lines = [
        "## FedVTC against Local",
        "",
        "FedVTC − Local in points, per seed, as the sum of four measured differences: "
        "**fine-tune** (FedVTC after − before its synthetic fine-tune), **FedVTC's training vs "
        "FedProto's** (FedVTC before its fine-tune − FedProto after the same R rounds: L_tc on "
        "f_k and the prototypes against FedProto's prototype term), **FedProto at R − final** "
        "(FedProto's 𝒯 extra rounds, negated) and **FedProto − Local**. Mean ± sd over seeds.",
        "",
        "| setting | seeds | FedVTC − Local | " + " | ".join(names) + " |",
        "|---|---|---|" + "---|" * len(names),
    ]
    for setting in dict.fromkeys(k[0] for k in by):
        rows = []
        for seed in sorted({k[2] for k in by if k[0] == setting}):
            v, fp, lo = (by.get((setting, m, seed)) for m in ("fedvtc", "fedproto", "local"))
            if not (v and fp and lo) or v.get("accuracy_before_finetune") is None:
                continue
            rounds = v["resolved_config"]["rounds"]
            at_r = next((p.get("accuracy") for p in fp["per_round"] if p["round"] == rounds), None)
            if at_r is None:
                continue
            terms = (v["final_accuracy"] - v["accuracy_before_finetune"],
                     v["accuracy_before_finetune"] - at_r, at_r - fp["final_accuracy"],
                     fp["final_accuracy"] - lo["final_accuracy"])
            total = v["final_accuracy"] - lo["final_accuracy"]
            if abs(sum(terms) - total) > 1e-9:
                raise AssertionError(
                    f"below_local: the terms of {setting} seed {seed} do not add up"
                )
            rows.append((total, terms))
        if rows:
            def ms(xs):
                sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
                return f"{statistics.fmean(xs):+.2f} ± {sd:.2f}"

            cols = [ms([100 * r[1][i] for r in rows]) for i in range(len(names))]
            lines.append(f"| {setting} | {len(rows)} | {ms([100 * r[0] for r in rows])} | "
                         + " | ".join(cols) + " |")
    return lines


def diagnostics(results: dict) -> str:
    """Per setting and seed, what the claims turn on: FedVTC's accuracy before and after the
    synthetic fine-tune with the oracle's verdict on the averaged ψ it fine-tunes on, ψ every
    round's accuracy and oracle, and the baselines; then how the fine-tune's change follows the
    oracle (Pearson r over the settings' seeds)."""
    runs = results["runs"]
    grid = [r for r in runs if r.get("role") == "grid"]
    by = {(r["setting"], r["method"], r["seed"]): r for r in grid}

    def pct(x):
        return "—" if x is None else f"{100 * x:.1f}"

    def at_round(run, fedvtc_run):
        """``run``'s evaluation after as many rounds as FedVTC trained (FedProto before its 𝒯 extra
        rounds)."""
        rounds = fedvtc_run["resolved_config"]["rounds"]
        return next((p.get("accuracy") for p in run["per_round"] if p["round"] == rounds), None)

    lines = [
        "## What the claims turn on (measured)",
        "",
        "Accuracies in %; **oracle**: the share of the averaged ψ's samples that the central "
        "classifier "
        "assigns to the intended class (chance 10 %); **device**: each device's own model on its "
        "own ψ_k. "
        "FedVTC's fine-tune trains on the averaged ψ's samples, so its change should follow the "
        "oracle. "
        "What L_tc's weight on f_k costs is measured on the validation split in tc_sweep.md.",
        "",
        "| setting | seed | FedVTC before fine-tune | after | change (points) | oracle | device | "
        "FedProto at round R | FedProto | Local |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    changes, oracles = [], []
    for setting in dict.fromkeys(r["setting"] for r in grid):
        for seed in sorted({r["seed"] for r in grid if r["setting"] == setting}):
            v = by.get((setting, "fedvtc", seed))
            fp, lo = by.get((setting, "fedproto", seed)), by.get((setting, "local", seed))
            if v is None:
                continue
            before, after = v.get("accuracy_before_finetune"), v["final_accuracy"]
            change = None if before is None else 100 * (after - before)
            if change is not None and v.get("oracle_agreement") is not None:
                changes.append(change)
                oracles.append(v["oracle_agreement"])
            lines.append(
                f"| {setting} | {seed} | {pct(before)} | {pct(after)} | "
                f"{'—' if change is None else f'{change:+.1f}'} | "
                f"{pct(v.get('oracle_agreement'))} | "
                f"{pct(v.get('device_agreement'))} | {pct(fp and at_round(fp, v))} | "
                f"{pct(fp and fp['final_accuracy'])} | {pct(lo and lo['final_accuracy'])} |"
            )

    def corr(xs, ys):
        return (
            statistics.correlation(xs, ys)
            if len(xs) >= 3 and statistics.pstdev(xs) > 0 and statistics.pstdev(ys) > 0
            else None
        )

    notes = []
    r_all = corr(oracles, changes)
    if r_all is not None:
        per = []
        for setting in dict.fromkeys(r["setting"] for r in grid):
            pairs = [
                (v["oracle_agreement"], 100 * (v["final_accuracy"] - v["accuracy_before_finetune"]))
                for (st, m, _), v in by.items()
                if st == setting
                and m == "fedvtc"
                and v.get("oracle_agreement") is not None
                and v.get("accuracy_before_finetune") is not None
            ]
            rs = corr([a for a, _ in pairs], [b for _, b in pairs])
            if rs is not None:
                per.append(f"{setting}: r = {rs:.2f}")
        notes.append(
            f"The fine-tune's change against the one-shot ψ's oracle, over {len(changes)} runs: "
            "Pearson "
            f"r = {r_all:.2f}" + (f" ({'; '.join(per)})" if per else "") + "."
        )
    pairs = [
        (by[(st, "fedvtc", sd)].get("oracle_agreement"), v.get("oracle_agreement"))
        for (st, m, sd), v in by.items()
        if m == "fedvtc-psi-round" and (st, "fedvtc", sd) in by
    ]
    pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
    if pairs:
        notes.append(
            f"ψ averaged every round is recognised by the oracle more often than the one-shot ψ in "
            f"{sum(b > a for a, b in pairs)} of {len(pairs)} runs (mean "
            f"{100 * statistics.fmean(b for _, b in pairs):.1f} % "
            f"against {100 * statistics.fmean(a for a, _ in pairs):.1f} %)."
        )
    pairs = [(v.get("accuracy_before_finetune"), by[(st, "fedproto", sd)]["final_accuracy"])
             for (st, m, sd), v in by.items() if m == "fedvtc" and (st, "fedproto", sd) in by]
    pairs = [(a, b) for a, b in pairs if a is not None]
    if pairs:
        notes.append(
            "Before its fine-tune, FedVTC is below FedProto's final accuracy (which includes 𝒯 "
            "extra real "
            "full-participation rounds, the paper's baseline budget) in "
            f"{sum(a < b for a, b in pairs)} of "
            f"{len(pairs)} runs."
        )
    # the after-fine-tune comparisons, listed after every setting's before-fine-tune one
    later: list[str] = []
    # FedVTC and fedvtc-tc0 against FedProto
    for setting in dict.fromkeys(r["setting"] for r in grid):
        gaps, tc0, diffs, orc = [], [], [], []
        for seed in sorted({r["seed"] for r in grid if r["setting"] == setting}):
            v, fp, t0 = (by.get((setting, m, seed)) for m in ("fedvtc", "fedproto", "fedvtc-tc0"))
            if not (v and fp):
                continue
            at_r = at_round(fp, v)
            if v.get("accuracy_before_finetune") is not None and at_r is not None:
                gaps.append(100 * (at_r - v["accuracy_before_finetune"]))
                if t0 and t0.get("accuracy_before_finetune") is not None:
                    tc0.append(100 * (at_r - t0["accuracy_before_finetune"]))
            if t0:
                diffs.append(100 * (t0["final_accuracy"] - fp["final_accuracy"]))
                if v.get("oracle_agreement") is not None and t0.get("oracle_agreement") is not None:
                    orc.append((v["oracle_agreement"], t0["oracle_agreement"]))
        if gaps:
            notes.append(
                f"{setting}: after the same R rounds of real data, FedProto is "
                f"{statistics.fmean(gaps):+.1f} points "
                f"(per seed {', '.join(f'{g:+.1f}' for g in gaps)}) over FedVTC before its "
                "fine-tune"
                + (
                    "; over FedVTC without L_tc on f_k (tc_weight 0), "
                    f"{statistics.fmean(tc0):+.1f} "
                    f"({', '.join(f'{g:+.1f}' for g in tc0)})"
                    if len(tc0) == len(gaps)
                    else ""
                )
                + "."
            )
        if diffs:
            later.append(
                f"{setting}: FedVTC without L_tc on f_k, after its fine-tune, against FedProto's "
                "final accuracy: "
                f"{statistics.fmean(diffs):+.2f} points (per seed "
                f"{', '.join(f'{d:+.2f}' for d in diffs)})"
                + (
                    f"; its ψ's oracle {100 * statistics.fmean(b for _, b in orc):.1f} % against "
                    "FedVTC's "
                    f"{100 * statistics.fmean(a for a, _ in orc):.1f} %"
                    if orc
                    else ""
                )
                + "."
            )
    notes += later
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    lines += [""] + below_local(runs) + [""] + earlier_cost() + [""] + tc_sweep_summary()
    return "\n".join(lines)


def earlier_cost() -> list[str]:
    """From the earlier grid (``ten_devices/results.json``, tc_weight 0.001, three seeds): per
    setting and tier, FedVTC − Local and fedvtc-tc0 − Local (final accuracy) and FedVTC − fedvtc-tc0
    before both fine-tunes (L_tc's cost to f_k), mean over the paired seeds."""
    path = Path(__file__).resolve().parent / "ten_devices" / "results.json"
    if not path.exists():
        return []
    runs = [r for r in json.loads(path.read_text())["runs"] if r.get("role") == "grid"]
    by = {(r["setting"], r["method"], r["seed"]): r for r in runs}
    lines = ["## Where the earlier grid lost to Local (ten devices, tc_weight 0.001)", "",
             "From [`ten_devices/results.json`](ten_devices/results.json) (three seeds), points, "
             "mean over seeds: per tier (two devices each), against Local: FedVTC, fedvtc-tc0 (f_k "
             "trained without L_tc, ψ still learning in its own step), ψ every round (the VTC "
             "aggregated every round) and FedProto, final accuracies; and L_tc's cost to f_k, "
             "FedVTC − fedvtc-tc0 before both fine-tunes.", "",
             "| setting | compared | tier 1 | tier 2 | tier 3 | tier 4 | tier 5 | all devices |",
             "|---|---|---|---|---|---|---|---|"]
    for setting in dict.fromkeys(k[0] for k in by):
        seeds = sorted(k[2] for k in by if k[0] == setting and k[1] == "fedvtc"
                       and (setting, "fedvtc-tc0", k[2]) in by and (setting, "local", k[2]) in by)
        if not seeds:
            continue
        for a, b in (("fedvtc", "local"), ("fedvtc-tc0", "local"), ("fedvtc-psi-round", "local"),
                     ("fedproto", "local")):
            cols = [statistics.fmean(100 * (by[(setting, a, sd)]["per_tier"][t]
                                            - by[(setting, b, sd)]["per_tier"][t])
                                     for sd in seeds) for t in TIERS]
            cols.append(statistics.fmean(100 * (by[(setting, a, sd)]["final_accuracy"]
                                                - by[(setting, b, sd)]["final_accuracy"])
                                         for sd in seeds))
            lines.append(f"| {setting} | {a} − {b} | " + " | ".join(f"{c:+.1f}" for c in cols)
                         + " |")
        cost = [100 * (by[(setting, "fedvtc", sd)]["accuracy_before_finetune"]
                       - by[(setting, "fedvtc-tc0", sd)]["accuracy_before_finetune"])
                for sd in seeds]
        lines.append(f"| {setting} | L_tc on f_k, before the fine-tunes | — | — | — | — | — | "
                     f"{statistics.fmean(cost):+.1f} |")
    return lines


def tc_sweep_summary() -> list[str]:
    """tc_sweep.md's verdict and tables (validation split, seeds 10–14), as committed."""
    path = Path(__file__).resolve().parent / "tc_sweep.md"
    if not path.exists():
        return []
    text = path.read_text().splitlines()
    chosen = [t for t in text if t.startswith("**Chosen") or t.startswith("**Not decided")]
    tables = [t for t in text if t.startswith("|")]
    return ["## tc_weight on the validation split ([tc_sweep.md](tc_sweep.md))", "",
            "FedVTC at the earlier grid's tc_weight 0.001 and at 0.0001, with Local beside it, "
            "on held-out training images (seeds 10–14; the test set never read); the rule, fixed "
            "before the runs: no collapsed run first, then mean validation accuracy.", "",
            *chosen, "", *tables[: next((i for i, t in enumerate(tables[2:], 2)
                                         if t.startswith("| candidate")), len(tables))],
            "", *tables[next((i for i, t in enumerate(tables) if t.startswith("| candidate")),
                             len(tables)):]]


def figures(results: dict, out: Path) -> str:
    """One sample grid per setting (seed 0's FedVTC run): a row per class, labelled with the
    oracle's share for that class (the closing round's averaged ψ); a column per sample
    (:data:`benchmarks.fedvtc.extras.SAMPLES_PER_CLASS` of them)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    lines, per_class = [], None
    for r in results["runs"]:
        samples = r.get("samples") or {}
        if r["method"] != "fedvtc" or r["role"] != "grid" or "uint8_base64" not in samples:
            continue
        img = np.frombuffer(base64.b64decode(samples["uint8_base64"]), np.uint8).reshape(
            samples["shape"]
        )
        rows, cols = img.shape[:2]
        per_class = cols
        fig, axes = plt.subplots(rows, cols, figsize=(cols * 0.7 + 1.6, rows * 0.7), squeeze=False)
        for i, c in enumerate(samples["classes"]):
            for j in range(cols):
                axes[i][j].imshow(img[i, j], cmap="gray")
                axes[i][j].set_xticks([])
                axes[i][j].set_yticks([])
            share = r.get(f"oracle_agreement_{c}")
            axes[i][0].set_ylabel(
                f"{c}" + (f": {100 * share:.0f} %" if share is not None else ""),
                rotation=0,
                ha="right",
                va="center",
                fontsize=8,
            )
        fig.suptitle(
            f"FedVTC ψ samples, {r['setting']}, seed {r['seed']} (class: oracle's share)",
            fontsize=9,
        )
        fig.tight_layout()
        name = f"samples_{r['setting']}.png"
        fig.savefig(out / name, dpi=100)
        plt.close(fig)
        lines.append(f"![ψ samples per class, {r['setting']}]({name})")
    if lines:
        lines.insert(
            0,
            f"Synthetic samples ψ(v) per class ({per_class} each, seed 0's FedVTC run; "
            "each image "
            "scaled to its own range), row labels: the class and the oracle's share of that "
            "class's samples "
            "it assigns to the class.\n",
        )
    return "\n\n".join(lines)
