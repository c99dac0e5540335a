"""Do the claims' signs survive the reduction (issue 37)? The earlier grid (``ten_devices/``: ten
devices, half per round, R = 24, three seeds, tc_weight 0.001) against this one (five devices,
three per round, R = 20 — the same 12 real-data epochs per device —, five seeds, the tc_weight
``tc_sweep.md`` chose): per claim over both, the mean paired difference ± sd and its sign, with the
differences over the seeds both grids share (0–2) beside them.

    python -m benchmarks.fedvtc.reduction    # writes reduction.md from the two results.json
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _ms(xs: list[float]) -> str:
    if not xs:
        return "—"
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{100 * statistics.fmean(xs):+.2f} ± {100 * sd:.2f} ({len(xs)})"


def _sign(x: float) -> str:
    return "+" if x > 0 else "−" if x < 0 else "0"


def compare(before: dict, after: dict) -> list[str]:
    old = {(c["statement"], c["setting"]): c for c in before["claims"]}
    lines = ["| claim | setting | ten devices, R = 24 (seeds) | five devices, R = 20 (seeds) | "
             "five devices, seeds 0–2 | the same sign |", "|---|---|---|---|---|---|"]
    for c in after["claims"]:
        o = old.get((c["statement"], c["setting"]))
        if o is None or c.get("metric") == "bytes_per_device" or not c.get("diffs"):
            continue
        shared = [d for s, d in zip(c["seeds"], c["diffs"], strict=True) if s in o["seeds"]]
        same = _sign(statistics.fmean(o["diffs"])) == _sign(statistics.fmean(c["diffs"]))
        lines.append(f"| `{c['statement']}` | {c['setting']} | {_ms(o['diffs'])} | "
                     f"{_ms(c['diffs'])} | {_ms(shared)} | {'yes' if same else '**no**'} |")
    return lines


def main() -> None:
    before = json.loads((HERE / "ten_devices" / "results.json").read_text())
    after = json.loads((HERE / "results.json").read_text())
    tc = next((r["config"]["options"].get("tc_weight") for r in after["runs"]
               if r["method"] == "fedvtc" and r.get("role") == "grid"), None)
    text = "\n".join([
        "# The claims' signs under the reduction", "",
        (__doc__ or "").split("\n\n", 1)[0].replace("\n", " "), "",
        f"This grid's tc_weight: {tc} (the earlier grid's: 0.001). Mean paired difference in "
        "points ± sd (runs). Neither grid's cells are all at one clean commit alike: the earlier "
        "ones are listed on `ten_devices/results.md`, this grid's on `results.md`.", "",
        *compare(before, after), "",
        "Command: `python -m benchmarks.fedvtc.reduction` (reads the two committed results.json).",
        ""])
    (HERE / "reduction.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
