"""The long fuzz run: ≥ 100,000 mutations of real captured messages of every method's uplink
and downlink kinds, through the receivers' own decode and check paths (tests/wire_fuzz.py), and
≥ 100,000 of everything else a device sends (issue 36, tests/device_fuzz.py): registrations,
status words, model reports, metrics replies, chunk headers and chunk acks, each timed.

Done when (issues 19 and 36): 0 exceptions other than the wire's error and 0 accepted messages
that violate the schema. Counts per method, direction, kind and outcome, and per mutation
operator, and the worst time per byte of each device message kind, go to results.json /
results.md next to this file.

    nice -n 10 python -m benchmarks.fuzz.run   # 13 methods, 104,000 + 102,000 cases (single core)
    python -m benchmarks.fuzz.run --cases 2000 --device-cases 1200 --methods fedavg   # smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from benchmarks.common import machine, write_json  # noqa: E402
from benchmarks.timing import command_line
from edgefl.algorithms import algorithm_names  # noqa: E402
from tests import device_fuzz, wire_fuzz  # noqa: E402

HERE = Path(__file__).parent


OUTCOMES = ("rejected", "accepted", "exception", "violation")


def outcome_cells(counts: dict[str, int]) -> str:
    """One table row's outcome counts, in the order of :data:`OUTCOMES`."""
    return " | ".join(str(counts.get(o, 0)) for o in OUTCOMES)


def outcome_table(first: str, rows: dict[str, dict[str, int]]) -> list[str]:
    """A markdown table of outcome counts, a row per key (the column ``first``)."""
    return [f"| {first} | {' | '.join(OUTCOMES)} |", "|---|---|---|---|---|",
            *[f"| {k} | {outcome_cells(v)} |" for k, v in rows.items()]]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=104_000)
    ap.add_argument("--methods", default=",".join(algorithm_names()))
    ap.add_argument("--device-cases", type=int, default=102_000)
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
    import logging
    import tempfile

    logging.disable(logging.CRITICAL)  # every refused registration logs a warning
    with tempfile.TemporaryDirectory() as tmp:
        dev = device_fuzz.fuzz(device_fuzz.kinds(Path(tmp)), args.device_cases, seed=args.seed)
    t3 = time.perf_counter()
    dev_totals = {o: dev.count(o) for o in OUTCOMES}
    dev_kinds = {}
    for (kind, outcome), n in sorted(dev.outcomes.items()):
        dev_kinds.setdefault(kind, {})[outcome] = n
    dev_ops = {}
    for (kind, op, outcome), n in sorted(dev.operators.items()):
        dev_ops.setdefault(f"{kind} {op}", {})[outcome] = n
    command = command_line("benchmarks.fuzz.run", argv)
    totals = {o: tally.count(o) for o in OUTCOMES}
    per_kind = {}
    for (method, direction, kind, outcome), n in sorted(tally.outcomes.items()):
        per_kind.setdefault(f"{method} {direction} {kind}", {})[outcome] = n
    per_op = {}
    for (op, outcome), n in sorted(tally.operators.items()):
        per_op.setdefault(op, {})[outcome] = n
    write_json(
        args.out / "results.json",
        {
            "command": command,
            "machine": machine(),
            "cases": tally.cases,
            "totals": totals,
            "message_kinds": len(cases),
            "capture_seconds": t1 - t0,
            "fuzz_seconds": t2 - t1,
            "per_kind": per_kind,
            "per_operator": per_op,
            "problems": tally.problems,
            "device_messages": {
                "cases": dev.cases,
                "totals": dev_totals,
                "fuzz_seconds": t3 - t2,
                "per_kind": dev_kinds,
                "per_operator": dev_ops,
                "worst_time_per_byte": dev.worst,
                "problems": dev.problems,
            },
        },
    )
    lines = [
        "# Wire fuzzing: mutations of real messages through the receivers' checks",
        "",
        f"Command: `{command}`  ",
        f"{tally.cases:,} cases over {len(cases)} captured messages "
        f"({len({c.method for c in cases})} methods, every kind each exchanges); "
        f"fuzzing took {t2 - t1:.0f} s on one core.  ",
        f"Machine: {json.dumps(machine())}",
        "",
        f"**Totals: rejected with WireError {totals['rejected']:,}; accepted and schema-valid "
        f"{totals['accepted']:,}; "
        f"other exceptions {totals['exception']}; accepted but violating the schema "
        f"{totals['violation']}.**",
        "",
        "Accepted cases are mutations the schema allows (a metadata field added or dropped where "
        "it is optional, a "
        "tensor value changed to another finite value, a re-sent copy, a downlink's arrays, which "
        "devices do not declare).",
        "",
        *outcome_table("message", per_kind),
        "",
        *outcome_table("mutation", per_op),
    ]
    if tally.problems:
        lines += ["", "First problems:", "", *[f"- {p}" for p in tally.problems]]
    lines += [
        "",
        "## Everything else a device sends (issue 36)",
        "",
        f"{dev.cases:,} cases over registrations, status words, model reports, metrics replies, "
        "chunk headers and chunk acks "
        "(tests/device_fuzz.py, through `Registry.handle`, `parse_status`, `parse_active`, "
        "`decode` + `check_reply`, "
        f"`Reassembler.add`, `ChunkSender.on_ack`); {t3 - t2:.0f} s on one core.",
        "",
        f"**Totals: rejected {dev_totals['rejected']:,}; accepted and schema-valid "
        f"{dev_totals['accepted']:,}; "
        f"other exceptions {dev_totals['exception']}; accepted but violating the schema "
        f"{dev_totals['violation']}.**",
        "",
        "| kind | rejected | accepted | exception | violation | worst µs per byte (bytes, "
        "mutation) | slowest case µs (bytes, mutation) |",
        "|---|---|---|---|---|---|---|",
        *[
            f"| {k} | {outcome_cells(v)} | "
            f"{1e6 * dev.worst[k]['seconds_per_byte']:.2f} ({dev.worst[k]['bytes']:,}, "
            f"{dev.worst[k].get('operator')}) | "
            f"{1e6 * dev.worst[k]['max_seconds']:.0f} ({dev.worst[k]['max_seconds_bytes']:,}, "
            f"{dev.worst[k].get('max_seconds_operator')}) |"
            for k, v in dev_kinds.items()
        ],
        "",
        "Each kind's 5 slowest cases per byte and 5 slowest overall (wall-clock, shared machine: "
        "load above) are timed again,"
        " best of 5, so that a scheduling pause is not counted as the message's cost; per byte, "
        "the smallest messages show"
        " their fixed cost (a 0-byte message counts as 1 byte). Only the receiver's call is "
        "timed: the state it is in (a registered"
        " device, a partial message, a transfer in flight) is set up before each case.",
        "",
        *outcome_table("kind and mutation", dev_ops),
    ]
    if dev.problems:
        lines += ["", "First problems:", "", *[f"- {p}" for p in dev.problems]]
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print(json.dumps({"envelopes": totals, "device_messages": dev_totals}))


if __name__ == "__main__":
    main()
