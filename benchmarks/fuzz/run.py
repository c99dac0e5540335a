"""The long fuzz run: ≥ 100,000 mutations of real captured messages of every method's uplink
and downlink kinds, through the receivers' own decode and check paths (tests/wire_fuzz.py).

Done when (issue 19): 0 exceptions other than the wire's error and 0 accepted messages that
violate the schema. Counts per method, direction, kind and outcome, and per mutation operator,
go to results.json / results.md next to this file.

    nice -n 10 python -m benchmarks.fuzz.run                 # 13 methods, 104,000 cases (single core)
    python -m benchmarks.fuzz.run --cases 2000 --methods fedavg   # smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from benchmarks.common import machine, write_json  # noqa: E402
from edgefl.algorithms import algorithm_names  # noqa: E402
from tests import wire_fuzz  # noqa: E402

HERE = Path(__file__).parent


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=104_000)
    ap.add_argument("--methods", default=",".join(algorithm_names()))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    cases = wire_fuzz.capture(args.methods.split(","))
    t1 = time.perf_counter()
    tally = wire_fuzz.fuzz(cases, args.cases, seed=args.seed)
    t2 = time.perf_counter()
    command = "python -m benchmarks.fuzz.run " + " ".join(sys.argv[1:] if argv is None else argv)
    totals = {o: tally.count(o) for o in ("rejected", "accepted", "exception", "violation")}
    per_kind = {}
    for (method, direction, kind, outcome), n in sorted(tally.outcomes.items()):
        per_kind.setdefault(f"{method} {direction} {kind}", {})[outcome] = n
    per_op = {}
    for (op, outcome), n in sorted(tally.operators.items()):
        per_op.setdefault(op, {})[outcome] = n
    write_json(args.out / "results.json", {
        "command": command, "machine": machine(), "cases": tally.cases, "totals": totals,
        "message_kinds": len(cases), "capture_seconds": t1 - t0, "fuzz_seconds": t2 - t1,
        "per_kind": per_kind, "per_operator": per_op, "problems": tally.problems,
    })
    lines = [
        "# Wire fuzzing: mutations of real messages through the receivers' checks",
        "",
        f"Command: `{command}`  ",
        f"{tally.cases:,} cases over {len(cases)} captured messages ({len({c.method for c in cases})} methods, every kind each exchanges); "
        f"fuzzing took {t2 - t1:.0f} s on one core.  ",
        f"Machine: {json.dumps(machine())}",
        "",
        f"**Totals: rejected with WireError {totals['rejected']:,}; accepted and schema-valid {totals['accepted']:,}; "
        f"other exceptions {totals['exception']}; accepted but violating the schema {totals['violation']}.**",
        "",
        "Accepted cases are mutations the schema allows (a metadata field added or dropped where it is optional, a "
        "tensor value changed to another finite value, a re-sent copy, a downlink's arrays, which devices do not declare).",
        "",
        "| message | rejected | accepted | exception | violation |",
        "|---|---|---|---|---|",
        *[f"| {k} | {v.get('rejected', 0)} | {v.get('accepted', 0)} | {v.get('exception', 0)} | {v.get('violation', 0)} |" for k, v in per_kind.items()],
        "",
        "| mutation | rejected | accepted | exception | violation |",
        "|---|---|---|---|---|",
        *[f"| {k} | {v.get('rejected', 0)} | {v.get('accepted', 0)} | {v.get('exception', 0)} | {v.get('violation', 0)} |" for k, v in per_op.items()],
    ]
    if tally.problems:
        lines += ["", "First problems:", "", *[f"- {p}" for p in tally.problems]]
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print(json.dumps(totals))


if __name__ == "__main__":
    main()
