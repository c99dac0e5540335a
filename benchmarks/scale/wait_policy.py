"""OpenMP's wait policy on a shared 2-core machine: torch's intra-op threads spin-waiting (libgomp's
default) against sleeping (``OMP_WAIT_POLICY=PASSIVE``), side by side in one invocation.

    python -m benchmarks.scale.wait_policy [--repeats 1] [--report-only]

The workload is a short ``edgefl simulate`` (FedVTC, 4 devices, 2 rounds, 1,500 images: every kind
of work a round does) at torch's default threads (one per core), run as a subprocess with libgomp's
spinning default (OMP_WAIT_POLICY empty, which libgomp ignores with a warning: the edgefl command
sets PASSIVE only where the variable is absent) and with PASSIVE, twice: on the machine as it is,
and with two busy processes (a pure-Python loop each, standing for other devices or services) on its
cores. Per run: wall seconds, the run's CPU seconds (user + system of the subprocess), and the final
accuracy (the policy must not change the numbers). The conditions alternate, so load drifts hit both
policies. Writes ``wait_policy.json`` and ``.md`` beside this file.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import machine, write_json
from benchmarks.timing import command_line

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
COMMAND = [
    "simulate",
    "--algorithm",
    "fedvtc",
    "--clients",
    "4",
    "--rounds",
    "2",
    "--train-samples",
    "1500",
    "--seed",
    "0",
]
POLICIES = {"default (spin)": None, "PASSIVE": "PASSIVE"}


def run_once(policy: str | None, out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    # the edgefl command sets PASSIVE itself unless told otherwise: the unset case asks for
    # libgomp's own default
    env["OMP_WAIT_POLICY"] = policy or ""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "edgefl.cli.main", *COMMAND, "--out", str(out), "--run-name", "r"],
        env=env,
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    summary = json.loads((out / "r" / "summary.json").read_text())
    return {
        "wall_seconds": round(wall, 2),
        "cpu_seconds": round(
            (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 2
        ),
        "accuracy": summary["mean_accuracy"],
    }


def busy(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--busy", type=int, default=2, help="busy processes in the loaded condition")
    ap.add_argument(
        "--report-only", action="store_true", help="rewrite wait_policy.md from wait_policy.json"
    )
    args = ap.parse_args()
    if args.report_only:
        return write_report(json.loads((HERE / "wait_policy.json").read_text()))
    runs = []
    start = machine()
    with tempfile.TemporaryDirectory() as tmp:
        for condition in ("as it is", f"{args.busy} busy processes"):
            procs = busy(args.busy) if condition != "as it is" else []
            try:
                time.sleep(2 if procs else 0)
                for rep in range(args.repeats):
                    order = (
                        list(POLICIES.items()) if rep % 2 == 0 else list(reversed(POLICIES.items()))
                    )
                    for label, policy in order:
                        load = [round(x, 2) for x in os.getloadavg()]
                        r = run_once(policy, Path(tmp) / f"{len(runs)}")
                        runs.append(
                            {
                                "condition": condition,
                                "policy": label,
                                "repeat": rep,
                                "load_before": load,
                                **r,
                            }
                        )
                        print(runs[-1], flush=True)
            finally:
                for p in procs:
                    p.kill()
                    p.wait()
    rows = []
    for condition in dict.fromkeys(r["condition"] for r in runs):
        cell = {
            label: [r for r in runs if r["condition"] == condition and r["policy"] == label]
            for label in POLICIES
        }
        wall = {
            label: statistics.median(r["wall_seconds"] for r in rs) for label, rs in cell.items()
        }
        cpu = {label: statistics.median(r["cpu_seconds"] for r in rs) for label, rs in cell.items()}
        acc = {label: sorted({r["accuracy"] for r in rs}) for label, rs in cell.items()}
        rows.append({"condition": condition, "wall": wall, "cpu": cpu, "accuracy": acc,
                     "spin_over_passive_wall": round(wall["default (spin)"] / wall["PASSIVE"], 2)})
    results = {
        "command": command_line("benchmarks.scale.wait_policy"),
        "workload": "edgefl " + " ".join(COMMAND),
        "machine_before": start,
        "machine_after": machine(),
        "runs": runs,
        "rows": rows,
    }
    write_json(HERE / "wait_policy.json", results)
    write_report(results)


def write_report(results: dict) -> None:
    start, rows = results["machine_before"], results["rows"]
    lines = [
        "# OpenMP wait policy: spinning against sleeping threads",
        "",
        __doc__.split("\n\n")[2].replace("\n", " "),
        "",
        f"Workload: `edgefl {' '.join(COMMAND)}`. Machine: {start['cores']} cores, load average "
        "before "
        f"{start['loadavg_1_5_15']}, after {results['machine_after']['loadavg_1_5_15']}; each "
        "run's load is in `wait_policy.json`.",
        "",
        "| condition | policy | wall s (median) | CPU s (median) | final accuracy |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        for label in POLICIES:
            acc = ", ".join(f"{100 * a:.2f} %" for a in row["accuracy"][label] if a is not None)
            lines.append(
                f"| {row['condition']} | {label} | {row['wall'][label]:.1f} | "
                f"{row['cpu'][label]:.1f} | {acc} |"
            )
    lines += [
        "",
        "Spinning ÷ PASSIVE, wall time: "
        + "; ".join(f"{r['condition']}: **{r['spin_over_passive_wall']}×**" for r in rows),
        "",
    ]
    (HERE / "wait_policy.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
