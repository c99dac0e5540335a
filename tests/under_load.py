"""Run the test suite N times under a CPU-bound background load and write what happened.

    python tests/under_load.py                       # `make test` 3 times, 4 busy processes
    python tests/under_load.py -n 1 -- tests/test_server_device.py -k kill
    python tests/under_load.py --out runs/under-load.json -- tests/test_mqtt_transport.py

Committed results: tests/under-load/*.json (the whole suite: tests/under-load/results.json).

Starts `--hogs` processes that spin a CPU each (4 on a 2-core machine: every process of the
tests gets a fraction of a core), runs the README's `make test` (or, given a selection after
`--`, `python -m pytest -q -p no:cacheprovider <selection>`) `-n` times, stops the busy processes
(each by its own id) and writes a JSON file: per run the exit status, passed/failed counts, the
failed test ids, the wall time, the speed factor the suite's `scaled` measured, and the load
average before and after; plus the machine and the commit. It exits 1 if any run failed. Tests that
pass here wait for events or scale their deadlines with the measured speed factor
(tests/conftest.py); a test that fails only here depends on machine load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOG = "while True: pass"


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    found = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    return found.group(1).strip() if found else platform.processor()


def start_hogs(n: int) -> list[subprocess.Popen]:
    return [
        subprocess.Popen([sys.executable, "-c", HOG], stdin=subprocess.DEVNULL) for _ in range(n)
    ]


def stop_hogs(hogs: list[subprocess.Popen]) -> None:
    for p in hogs:
        p.terminate()
    for p in hogs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


def counts(output: str) -> dict[str, int]:
    """pytest -q's summary line, e.g. '3 failed, 18 passed, 2 skipped in 25.72s' (make's own
    lines may follow it)."""
    summary = r"\b(passed|failed|errors?|no tests ran)\b.* in [0-9.]+s"
    lines = [x for x in output.splitlines() if re.search(summary, x)]
    tail = lines[-1] if lines else ""
    return {
        word: int(n)
        for n, word in re.findall(
            r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed|xpassed)", tail
        )
    }


def command(selection: list[str]) -> list[str]:
    """The README's `make test`, or pytest on a selection."""
    if not selection:
        return ["make", "test"]
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *selection]


PROGRESS = re.compile(r"\[\s*(\d+)%\]\s*$")


def one_run(selection: list[str], log: Path, name: str = "run") -> dict:
    """One run of the selection, its output into ``log``; pytest's progress (the ``[ 15%]`` at
    the end of its lines) printed as it comes, with the time so far."""
    load_before = os.getloadavg()
    t0 = time.monotonic()
    cmd = command(selection)
    print(f"{name}: {' '.join(cmd)} (log: {log})", flush=True)
    with log.open("w") as f:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            errors="replace",
        )
        for line in proc.stdout:
            f.write(line)
            f.flush()
            done = PROGRESS.search(line)
            if done:
                print(
                    f"{name}: {done.group(1)}% after {time.monotonic() - t0:.0f} s "
                    f"(load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
        rc = proc.wait()
    wall = time.monotonic() - t0
    out = log.read_text(errors="replace")
    speed = re.search(r"speed factor ([0-9.]+), at most ([0-9.]+)", out)
    return {
        "returncode": rc,  # negative: pytest was stopped by that signal
        "passed": rc == 0,
        "counts": counts(out),
        "failed": sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", out, re.M))),
        "wall_seconds": round(wall, 1),
        "speed_factor_last": float(speed.group(1)) if speed else None,
        "speed_factor_max": float(speed.group(2)) if speed else None,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "log": str(log),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "-n", "--runs", type=int, default=3, help="how many times to run the selection (default 3)"
    )
    parser.add_argument(
        "--hogs", type=int, default=4, help="CPU-bound background processes (default 4)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "under-load" / "results.json",
                        help="the results file (JSON; default tests/under-load/results.json)")
    parser.add_argument(
        "selection",
        nargs="*",
        default=[],
        help="pytest arguments after -- (default: none, the suite as `make test` runs it)",
    )
    args = parser.parse_args(argv)
    if args.runs < 1 or args.hogs < 0:
        parser.error("--runs must be >= 1 and --hogs >= 0")
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"under-load-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    result = {
        "command": " ".join(
            [
                Path(sys.executable).name,
                "tests/under_load.py",
                "-n",
                str(args.runs),
                "--hogs",
                str(args.hogs),
                *(["--", *args.selection] if args.selection else []),
            ]
        ),
        "runs_command": " ".join(command(args.selection)),
        "selection": args.selection,
        "hogs": args.hogs,
        "cpus": os.cpu_count(),
        "machine": f"{platform.machine()} {cpu_model()}".strip(),
        "commit": commit,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_before_hogs": [round(x, 2) for x in os.getloadavg()],
        "runs": [],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # stopped (kill, Ctrl-C, also as a background job that ignores SIGINT): the busy processes
    # are stopped too (`finally`), never left spinning
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    hogs = start_hogs(args.hogs)
    try:
        for i in range(args.runs):
            run = one_run(args.selection, logs / f"run-{i + 1}.log", f"run {i + 1}/{args.runs}")
            result["runs"].append(run)
            # so far (a stopped series keeps its runs)
            args.out.write_text(json.dumps(result, indent=2) + "\n")
            print(
                f"run {i + 1}/{args.runs}: {'passed' if run['passed'] else 'FAILED'} "
                f"{run['counts']} in {run['wall_seconds']} s "
                f"(load {run['load_before'][0]} -> {run['load_after'][0]}, speed factor up to "
                f"{run['speed_factor_max']})"
                + (f" failed: {', '.join(run['failed'])}" if run["failed"] else ""),
                flush=True,
            )
    finally:
        stop_hogs(hogs)
    result["load_after_hogs"] = [round(x, 2) for x in os.getloadavg()]
    result["all_passed"] = all(r["passed"] for r in result["runs"])
    result["total_seconds"] = round(sum(r["wall_seconds"] for r in result["runs"]), 1)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"{'all passed' if result['all_passed'] else 'SOME RUN FAILED'}: {args.out} (logs in "
        f"{logs})"
    )
    return 0 if result["all_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
