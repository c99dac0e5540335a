"""The diagnostics on FedHeNN's page (results.md), measured from the runs: why k = 2 collapsed
(recipes.md, collapse.md), the runs at the earlier recipes, FedHeNN − Local without collapsed
devices, and the alignment diagnostic (alignment.md)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from benchmarks import gates

HERE = Path(__file__).resolve().parent
PRIOR_LOSS = 0.6  # a training loss this close to ln 2 after 20 epochs: the two-class prior
#: the committed runs at the earlier recipes: (file under previous/, what it ran)
EARLIER = (
    ("no-decay-results.json", "lr 0.05 constant"),
    ("lr005-results.json", "lr 0.05, ×0.1 at 40 %/70 %"),
)


def table(path: Path) -> list[dict[str, str]]:
    """The rows of the first markdown table in ``path`` (none if it does not exist)."""
    if not path.exists():
        return []
    lines = [x for x in path.read_text().splitlines() if x.startswith("|")]
    cells = [[c.strip() for c in x.strip("|").split("|")] for x in lines]
    return [dict(zip(cells[0], c, strict=True)) for c in cells[2:]] if cells else []


def ms(xs: list[float], scale: float = 100.0) -> str:
    if not xs:
        return "—"
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{scale * statistics.fmean(xs):+.2f} ± {scale * sd:.2f}"


def grid(runs: list[dict]) -> dict[tuple, dict]:
    return {(r["setting"], r["method"], r["seed"]): r for r in runs if r.get("role") == "grid"}


def collapse(runs: list[dict]) -> str:
    """Why k = 2 collapsed, from the recipe sweep and the one-device runs, and the devices that
    predict one class at each recipe the benchmark ran (the earlier runs' from the proxy)."""
    out = ["## Why devices collapsed at k = 2, and the recipe that fixed it", ""]
    sweep = HERE / "recipes.json"
    if sweep.exists():
        result = json.loads(sweep.read_text())
        out.append(
            "The recipe sweep ([recipes.md](recipes.md); validation split, seeds 10–14, chosen "
            f"before this run: **{result.get('chosen') or 'none, no candidate stable yet'}**), "
            "devices predicting one class:")
        out.append("")
        out += [f"- {r['recipe']}, {r['method']}: {r['collapsed_devices']} of {r['devices']} "
                f"devices in {len(r['seeds'])} runs; validation local accuracy "
                f"{ms(r['local']).lstrip('+')} %" for r in result["rows"] if r["seeds"]]
        out.append("")
    for page, what in (("collapse.md", "one device at a time"),
                       ("collapse_stuck.md", "the devices that collapsed, trained alone")):
        rows = table(HERE / page)
        for recipe in dict.fromkeys(r["recipe"] for r in rows):
            mine = [r for r in rows if r["recipe"] == recipe]
            one = [r for r in mine if r["one class?"] == "yes"]
            prior = [r for r in mine if float(r["loss ep. 20"]) >= PRIOR_LOSS]
            out.append(
                f"- {what} ([{page}]({page})), {recipe}: {len(one)} of {len(mine)} devices end "
                f"predicting one class; {len(prior)} end with a training loss ≥ {PRIOR_LOSS} "
                "(ln 2 = 0.693 is the two-class prior): "
                + (", ".join(f"{r['loss ep. 20']} (tier {r['tier']}, classes "
                             f"{r['images per class']})" for r in prior) or "—"))
        if rows:
            out.append("")
    out += ["Devices predicting one class per run of this benchmark's grid (k = 2), at each "
            "recipe it has run (the earlier runs' read by the proxy, see Sanity gates):", "",
            "| method | " + " | ".join(w for _, w in EARLIER) + " | this run (Adam 1e-3) |",
            "|---|" + "---|" * (len(EARLIER) + 1)]
    tables = [json.loads((HERE / "previous" / f).read_text())["runs"]
              for f, _ in EARLIER if (HERE / "previous" / f).exists()]
    if len(tables) < len(EARLIER):
        return "\n".join(out[:-4])
    for method in dict.fromkeys(k[1] for k in grid(runs)):
        cols = []
        for earlier in [*tables, runs]:
            rs = [r for k, r in sorted(grid(earlier).items()) if k[:2] == ("k2", method)]
            n = [len(gates.collapsed_devices(r)[0]) for r in rs if r.get("client_accuracy")]
            cols.append(f"{sum(n)} of {10 * len(n)} ({len(n)} runs)" if n else "—")
        out.append(f"| {method} | " + " | ".join(cols) + " |")
    return "\n".join(out)


def without_collapsed(runs: list[dict]) -> str:
    """FedHeNN − Local on each device's local split, over the devices that predict more than one
    class in both runs (:func:`benchmarks.gates.collapsed_devices`), paired by seed and device:
    what the alignment adds where neither run collapsed, against the same over every device."""
    by = grid(runs)
    lines = [
        "## Does the alignment term add anything over Local?",
        "",
        "η₀ = 0 is Local (the paper's eq. 5). Per device (paired by seed and device), FedHeNN − "
        "Local on the device's local split, in points: over every device, and over the devices "
        "that predict more than one class in both runs; and per run (the claim's unit).",
        "",
        "| setting | devices | every device | devices left | neither collapsed | per run |",
        "|---|---|---|---|---|---|",
    ]
    for setting in dict.fromkeys(k[0] for k in by):
        every, kept, per_run = [], [], []
        for seed in sorted({k[2] for k in by if k[0] == setting}):
            f, lo = by.get((setting, "fedhenn", seed)), by.get((setting, "local", seed))
            if not (f and lo and f.get("client_local_accuracy")
                    and lo.get("client_local_accuracy")):
                continue
            per_run.append(f["local_accuracy"] - lo["local_accuracy"])
            fallen = set(gates.collapsed_devices(f)[0]) | set(gates.collapsed_devices(lo)[0])
            for d, acc in f["client_local_accuracy"].items():
                diff = acc - lo["client_local_accuracy"][d]
                every.append(diff)
                if d not in fallen:
                    kept.append(diff)
        if every:
            lines.append(f"| {setting} | {len(every)} | {ms(every)} | {len(kept)} | {ms(kept)} | "
                         f"{ms(per_run)} ({sum(x > 0 for x in per_run)} of {len(per_run)} "
                         "seeds > 0) |")
    return "\n".join(lines)


def diagnostics(results: dict) -> str:
    """The page's diagnostics (the module's docstring)."""
    runs = results["runs"]
    out = [collapse(runs), without_collapsed(runs)]
    page = HERE / "alignment.md"
    if page.exists():
        body = page.read_text().split("\n", 1)[1].strip()
        out.append(
            "## Diagnostic: does the alignment term move the representations?\n\n"
            "From [alignment.md](alignment.md) (`python -m benchmarks.fedhenn.alignment`; "
            + ("its recipe and commit below" if "\nRecipe: " in body else
               "run at the earlier recipe, lr 0.05 with the decay, before the grid's Adam")
            + "): how far the devices' kernels align with K̄ at each η₀ against η₀ = 0, next to "
            "the accuracy it buys.\n\n" + body
        )
    return "\n\n".join(x for x in out if x)
