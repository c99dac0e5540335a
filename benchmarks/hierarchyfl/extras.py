"""The hook every HierarchyFL cell runs (``record_extras="benchmarks.hierarchyfl.extras:extras"``).

Apart from the grid and the page (:mod:`benchmarks.hierarchyfl`), so that the cells' code hash
(:mod:`benchmarks.provenance`) covers what a cell runs, not the page's text; it must not import
the benchmark's package.
"""

from __future__ import annotations

from typing import Any

from benchmarks.cells import RunOutput


def extras(run: RunOutput) -> dict[str, Any]:
    """``meta_weights``: M per round ({tier: weight}); ``meta_weight_spread``: max − min of the last
    round's M (0 = uniform); ``distillation``: every ``distill_*``, ``check_*`` and ``meta_grad``
    server metric per round."""
    meta, distill = [], {}
    for r in run.rounds:
        server = r.get("server") or {}
        m = {
            k.removeprefix("meta_weight_"): v
            for k, v in server.items()
            if k.startswith("meta_weight_")
        }
        if m:
            meta.append({"round": r["round"], **m})
        for k, v in server.items():
            if k.startswith(("distill", "check_", "meta_grad")) and isinstance(v, (int, float)):
                distill.setdefault(k, []).append(v)
    last = {k: v for k, v in meta[-1].items() if k != "round"} if meta else {}
    return {
        "meta_weights": meta,
        "meta_weight_spread": (max(last.values()) - min(last.values())) if last else None,
        "distillation": distill,
    }
