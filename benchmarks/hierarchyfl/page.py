"""The HierarchyFL page's own sections (results.md): the accuracy per depth tier per round, the
two readings of the public set side by side, the gain per tier against the headroom under the
bound and split into labels and distillation, and the server step's meta-learner. Read from the
results at report time; nothing here runs in a cell."""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks import pages
from benchmarks.hierarchyfl import CLAIMED, DEPTH, SMALL
from benchmarks.runner import band_panel


def figures(results: dict, out) -> str:
    """Accuracy per round for each depth tier (columns) in each claimed setting (rows): every
    method's mean over seeds with a band of ± 1 sd, and the tier's centralized bound (dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in results["runs"] if r["setting"] in CLAIMED]
    settings = [s for s in CLAIMED if any(r["setting"] == s for r in runs)]
    if not settings:
        return ""
    bound = {
        t: r["per_tier"][t]
        for r in results.get("bound_runs", {}).get("centralized", [])
        for t in r["per_tier"]
    }
    fig, axes = plt.subplots(
        len(settings), len(DEPTH), figsize=(4.2 * len(DEPTH), 3.3 * len(settings)), squeeze=False
    )
    for row, setting in zip(axes, settings, strict=True):
        rs = [r for r in runs if r["setting"] == setting]
        for ax, t in zip(row, DEPTH, strict=True):
            band_panel(
                ax,
                rs,
                lambda p, t=t: (p.get("per_tier") or {}).get(t),
                {"centralized": bound.get(t)},
                f"{setting}: tier {t} (exit {t})",
                "device test accuracy (%)",
                lw=1.3,
                fontsize=9,
                legend_size=6,
            )
    fig.suptitle("accuracy per round per depth tier (mean ± sd over seeds)", fontsize=11)
    fig.tight_layout()
    fig.savefig(out / "accuracy_per_tier.png", dpi=100)
    plt.close(fig)
    return "![accuracy per round per depth tier](accuracy_per_tier.png)"


def per_tier(results: dict) -> list[str]:
    """Per depth tier at Dir(0.1) and Dir(0.5): each method's accuracy, the centralized bound of
    that tier, HierarchyFL's gain over HeteroFL against the headroom HeteroFL leaves under the
    bound, and the gain split into what the public labels give (hierarchyfl-labels − heterofl) and
    what the distillation adds on top of them (hierarchyfl − hierarchyfl-labels)."""
    runs = results["runs"]
    bound = {
        t: r["per_tier"][t]
        for r in results.get("bound_runs", {}).get("centralized", [])
        for t in r["per_tier"]
    }
    methods = ("heterofl", "hierarchyfl-labels", "hierarchyfl-logits", "hierarchyfl")

    def tier_mean(method, setting, t):
        xs = [
            r["per_tier"].get(t) for r in runs if (r["method"], r["setting"]) == (method, setting)
        ]
        return statistics.fmean(xs) if xs and None not in xs else None

    lines = [
        "## Per tier: the gain, the headroom under the bound, labels against distillation",
        "",
        "Mean over seeds, in %. headroom: the tier's centralized bound − HeteroFL; closed: the "
        "gain ÷ "
        "the headroom. labels: hierarchyfl-labels − heterofl (the public labels' CE alone); "
        "distillation: hierarchyfl − hierarchyfl-labels.",
        "",
        "| setting | tier | "
        + " | ".join(methods)
        + " | bound | gain | headroom | closed | labels | distillation |",
        "|---|---|" + "---|" * (len(methods) + 6),
    ]

    def f(x):
        return "—" if x is None else f"{100 * x:.1f}"

    for setting in ("dir0.1", "dir0.5"):
        for t in DEPTH:
            acc = {m: tier_mean(m, setting, t) for m in methods}
            if acc["heterofl"] is None or acc["hierarchyfl"] is None:
                continue
            gain = acc["hierarchyfl"] - acc["heterofl"]
            room = bound[t] - acc["heterofl"] if t in bound else None
            closed = f"{gain / room:.0%}" if room else "—"
            labels = (
                acc["hierarchyfl-labels"] - acc["heterofl"]
                if acc["hierarchyfl-labels"] is not None
                else None
            )
            distil = (
                acc["hierarchyfl"] - acc["hierarchyfl-labels"]
                if acc["hierarchyfl-labels"] is not None
                else None
            )
            lines.append(
                f"| {setting} | {t} | "
                + " | ".join(f(acc[m]) for m in methods)
                + f" | {f(bound.get(t))} | {f(gain)} | {f(room)} | {closed} | {f(labels)} | "
                f"{f(distil)} |"
            )
    lines += labels_share(runs) + labels_share(runs, "dir0.1-public60")[1:] + [
        "Per seed (where a paired difference's sd comes from), in %:",
        "",
        "| setting | method | " + " | ".join(f"tier {t} by seed" for t in DEPTH) + " |",
        "|---|---|" + "---|" * len(DEPTH),
    ]
    for setting in ("dir0.1", "dir0.5"):
        for method in ("heterofl", "hierarchyfl"):
            rs = sorted(
                (r for r in runs if (r["method"], r["setting"]) == (method, setting)),
                key=lambda r: r["seed"],
            )
            if rs:
                lines.append(f"| {setting} | {method} | " + " | ".join(
                    " / ".join(f(r["per_tier"].get(t)) for r in rs) for t in DEPTH) + " |")
    return lines + [""]


def labels_share(runs: list[dict], setting: str = "dir0.1") -> list[str]:
    """How much of HierarchyFL's gain over HeteroFL (final accuracy, paired by seed) the public
    labels' cross-entropy alone gives (hierarchyfl-labels − heterofl) and how much the distillation
    adds on top (hierarchyfl − hierarchyfl-labels): measured where the labels-only control ran."""
    acc = {
        (r["method"], r["seed"]): r["final_accuracy"] for r in runs if r["setting"] == setting
    }
    seeds = sorted(s for (m, s) in acc if m == "hierarchyfl-labels")
    seeds = [s for s in seeds if ("heterofl", s) in acc and ("hierarchyfl", s) in acc]
    if len(seeds) < 2:
        return [""]

    def diff(a, b):
        xs = [100 * (acc[(a, s)] - acc[(b, s)]) for s in seeds]
        return statistics.fmean(xs), statistics.stdev(xs)

    (gain, gsd), (lab, lsd), (dis, dsd) = (
        diff("hierarchyfl", "heterofl"),
        diff("hierarchyfl-labels", "heterofl"),
        diff("hierarchyfl", "hierarchyfl-labels"),
    )
    public = "60" if setting.endswith("-public60") else "600"
    most = ("most of the headline gain is supervised training on the labelled public images at "
            "the server, not the distillation" if lab > gain / 2 else
            "the labels' CE alone gives less than half of the headline gain")
    return [
        "",
        f"**How much of the gain over HeteroFL is the public labels' cross-entropy** ({setting}, "
        f"{public} public images, final accuracy, paired by seed over seeds {seeds}): "
        f"HierarchyFL − HeteroFL {gain:+.2f} ± {gsd:.2f} points; the server step with the public "
        f"labels' CE alone (hierarchyfl-labels − heterofl) {lab:+.2f} ± {lsd:.2f}, "
        f"**{lab / gain:.0%} of the gain**; the distillation on top of it (hierarchyfl − "
        f"hierarchyfl-labels, the fair control, a counted claim) {dis:+.2f} ± {dsd:.2f}, "
        f"{dis / gain:.0%}. HeteroFL never sees the public labels: here {most}. The labels-only "
        "control did not run at Dir(0.5), so the split is not measured there.",
        "",
    ]


def readings(results: dict) -> list[str]:
    """The two readings of the public set side by side: each claim at 600 images and at 60."""
    claims = results["claims"]

    def cell(c):
        if c is None:
            return "— | —"
        md = "—" if c["mean_diff"] is None else f"{100 * c['mean_diff']:+.2f} ± {100 * c['sd']:.2f}"
        return f"{md} | {c['verdict']}"

    lines = [
        "## The two readings of the public set, side by side",
        "",
        "Each claim at 600 public images (1 % of Fashion-MNIST's 60,000) and at 60 (1 % of these "
        "devices' 6,000), "
        "both main settings and both counted; mean ± sd of the paired differences, in points.",
        "",
        "| claim | setting | metric | the paper's number | 600 images | verdict | 60 images | "
        "verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in claims:
        if c["setting"].endswith(SMALL) or c["setting"].startswith("gain:"):
            continue
        twin = next(
            (
                x
                for x in claims
                if x["statement"] == c["statement"]
                and x["metric_a"] == c["metric_a"]
                and x["metric_b"] == c["metric_b"]
                and x["setting"] == c["setting"] + SMALL
            ),
            None,
        )
        lines.append(
            f"| `{c['statement']}` | {c['setting']} | {c['metric']} | {c.get('paper') or '—'} | "
            f"{cell(c)} | {cell(twin)} |"
        )
    return lines + [""]


#: the 32-round profile's page as committed before the hour's cut (issue 37)
PREVIOUS = Path(__file__).resolve().parent / "previous32" / "results.json"


def diagnostics(results: dict) -> str:
    """The two public-set readings side by side; per tier, the gain against the headroom and split
    into labels and distillation; the meta-learner's weights at the last round and the
    distillation check, per method and setting."""
    runs = results["runs"]
    lines = (
        readings(results)
        + per_tier(results)
        + pages.against_previous(
            results, PREVIOUS, "## Against the 32-round profile (the sign of every claim)",
            "The cells committed before this profile (`previous32/`: the same fleet, data, "
            "models, settings and seeds at 32 rounds, ×0.1 before rounds 14 and 23; about 77 min "
            "to regenerate on this project's Zen 4, [`cost32/`](cost32/README.md))")
        + [
            "",
            "## The 32-round profile on a slower machine",
            "",
            "Started at clean 205eb57 on 2026-11-27 and stopped after 7 bounds and 2 grid cells: "
            "~200 CPU-seconds a grid cell there, about 2 hours for the grid at 2 workers on that "
            "machine (Zen 3, AVX2), against the 51 minutes estimated from the earlier machine's "
            "wall times ([regeneration_attempt.md](regeneration_attempt.md)).",
            "",
        ]
        + [
            "## Server step",
            "",
            "M at the last round (mean over seeds; uniform = 1/tiers) and its spread (max − min); "
            "the "
            "distillation check (each exit's validation accuracy before and after distillation) "
            "when the "
            "method reports it.",
            "",
            "| setting | method | M (last round) | spread | distillation metrics (mean over "
            "rounds and seeds) |",
            "|---|---|---|---|---|",
        ]
    )
    for key in dict.fromkeys((r["setting"], r["method"]) for r in runs):
        rs = [r for r in runs if (r["setting"], r["method"]) == key and r.get("meta_weights")]
        if not rs:
            continue
        last = [{k: v for k, v in r["meta_weights"][-1].items() if k != "round"} for r in rs]
        tiers = list(last[0])
        m = ", ".join(f"{t}: {statistics.fmean(x[t] for x in last):.3f}" for t in tiers)
        spread = statistics.fmean(
            r["meta_weight_spread"] for r in rs if r["meta_weight_spread"] is not None
        )
        names = sorted({k for r in rs for k in r.get("distillation", {})})
        dist = (
            ", ".join(
                f"{n}: {statistics.fmean(v for r in rs for v in r['distillation'].get(n, [])):.4f}"
                for n in names
            )
            or "—"
        )
        lines.append(f"| {key[0]} | {key[1]} | {m} | {spread:.3f} | {dist} |")
    return "\n".join(lines)
