"""Whether two cell caches hold the same runs: ``python -m benchmarks.same_runs OLD NEW [--out F]``,
each a cells folder, or ``FOLDER@CODEHASH`` for the records of one code in it (a benchmark's own
cache holds every code's records side by side).

For every cell configuration (key) cached in both folders (the newest record of each), it compares
what the runs measured: the final accuracy, each device's, and the per-round curve on the rounds
both evaluated (a point marked as the final evaluation, :func:`benchmarks.cells.curve_points`, is
not a per-round one). What it answers: whether a code change that was meant to change no training
(e.g. a new evaluation point) left the runs as they were, so that cells of the old code still stand
for the new one. Writes a Markdown table (to ``--out`` or standard output); exits 1 where a shared
cell differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.cells import legacy_curve


def newest(folder: Path, code: str = "") -> dict[str, dict]:
    """``{key: record}``, the newest record of each key in ``folder`` (of code hash ``code``
    where one is given: the records named ``<key>-<code>.json``)."""
    out: dict[str, dict] = {}
    for path in sorted(folder.glob(f"*-{code}.json" if code else "*.json")):
        record = legacy_curve(json.loads(path.read_text()))
        key = record.get("key")
        if key and record.get("finished_at", "") >= out.get(key, {}).get("finished_at", ""):
            out[key] = record
    return out


def curve(record: dict) -> dict[int, float]:
    return {p["round"]: p["accuracy"] for p in record.get("per_round", [])
            if p.get("accuracy") is not None and not p.get("final")}


def compare(old: dict, new: dict) -> dict:
    a, b = curve(old), curve(new)
    shared = sorted(set(a) & set(b))
    return {
        "cell": f"{new.get('setting')}:{new.get('method')}:s{new.get('seed')}",
        "final": (old.get("final_accuracy"), new.get("final_accuracy")),
        "final_same": old.get("final_accuracy") == new.get("final_accuracy"),
        "devices_same": old.get("client_accuracy") == new.get("client_accuracy"),
        "rounds_shared": len(shared),
        "curve_same": all(a[r] == b[r] for r in shared),
        "only_new": sorted(set(b) - set(a)),
        "only_old": sorted(set(a) - set(b)),
        "code": (old.get("code_hash"), new.get("code_hash")),
    }


def table(rows: list[dict], old_dir: Path, new_dir: Path) -> str:
    same = sum(r["final_same"] and r["devices_same"] and r["curve_same"] for r in rows)
    lines = [
        f"Cells cached in both `{old_dir}` and `{new_dir}`: {len(rows)}; the same runs (final "
        f"accuracy, every device's, and the curve on the rounds both evaluated): **{same} of "
        f"{len(rows)}**.",
        "",
        "| cell | final % (old → new) | devices | curve (rounds both evaluated) | rounds only new "
        "| rounds only old | code (old → new) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        fo, fn = (("—" if x is None else f"{100 * x:.3f}") for x in r["final"])
        lines.append(
            f"| {r['cell']} | {fo} → {fn}{'' if r['final_same'] else ' **differs**'} | "
            f"{'same' if r['devices_same'] else '**differ**'} | "
            f"{'same' if r['curve_same'] else '**differs**'} ({r['rounds_shared']}) | "
            f"{', '.join(map(str, r['only_new'])) or '—'} | "
            f"{', '.join(map(str, r['only_old'])) or '—'} | {r['code'][0]} → {r['code'][1]} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("old", help="a cells folder (the older code's), or FOLDER@CODEHASH")
    p.add_argument("new", help="a cells folder (the newer code's), or FOLDER@CODEHASH")
    p.add_argument("--out", type=Path, help="write the table here (default: standard output)")
    args = p.parse_args(argv)
    found = []
    for spec in (args.old, args.new):
        folder, _, code = spec.partition("@")
        if not Path(folder).is_dir():
            p.error(f"{folder}: not a folder")
        found.append(newest(Path(folder), code))
    old, new = found
    rows = sorted((compare(old[k], new[k]) for k in set(old) & set(new)),
                  key=lambda r: r["cell"])
    if not rows:
        p.error("no cell configuration is cached in both folders")
    text = table(rows, args.old, args.new)
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0 if all(r["final_same"] and r["devices_same"] and r["curve_same"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
