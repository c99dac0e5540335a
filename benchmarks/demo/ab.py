"""``make demo`` of two checkouts side by side.

    python -m benchmarks.demo.ab BASE [--repetitions N]

Alternates (:mod:`benchmarks.timing`, the load before and after every sample) the whole ``make
demo`` of the checkout at BASE (a path, e.g. a ``git worktree add --detach /tmp/base COMMIT``)
and of this one, each with this interpreter's venv and its own ``edgefl`` first on
``PYTHONPATH`` (the venv's editable install points at one checkout; the server, the fork server
and the device processes all inherit the path), and writes ``ab.json`` and ``ab.md`` beside this
file: the wall seconds of each and this checkout ÷ BASE as the median of the ratios of samples
taken side by side. Each sample also keeps the run's mean accuracy, so a change meant to alter
only the time shows that it did not alter the result. What a change of the demo's wall time is
worth is measured this way, not against a number from another run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.timing import Timing, git_state

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def make_demo(checkout: Path) -> dict:
    """One sample: the wall seconds of ``make demo`` in ``checkout``, its accuracy beside it."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    t0 = time.perf_counter()
    # -o: the venv is taken as installed (make would otherwise reinstall a checkout into it)
    subprocess.run(["make", "-o", f"{sys.prefix}/.installed-stamp", "demo", f"VENV={sys.prefix}"],
                   cwd=checkout, env=env, check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - t0
    summary = json.loads((checkout / "runs" / "demo" / "summary.json").read_text())
    return {"value": seconds, "mean_accuracy": summary.get("mean_accuracy")}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("base", type=Path, help="the other checkout (its make demo is the baseline)")
    p.add_argument("--repetitions", type=int, default=2)
    args = p.parse_args(argv)
    base = args.base.resolve()
    if not (base / "Makefile").exists():
        raise SystemExit(f"{base} is not a checkout of edgefl (no Makefile)")
    base_git = git_state(base)
    timing = Timing("make demo: this checkout against another, side by side", HERE,
                    settings={**vars(args), "base": str(base), "base_git": base_git})
    names = {"base": f"base {str(base_git.get('commit'))[:7]}", "this": "this checkout"}
    variants = {names["base"]: lambda: make_demo(base), names["this"]: lambda: make_demo(ROOT)}
    timing.alternate("make demo", variants,
                     args.repetitions, baseline=names["base"],
                     on_sample=lambda s: print(f"{s['variant']}: {s['value']} s, accuracy "
                                               f"{s.get('mean_accuracy')}", flush=True))
    results = timing.write(name="ab", extra_md=[
        "", f"Base: `{base_git.get('commit')}` ({'clean' if base_git.get('clean') else 'dirty'} "
        f"tree) at `{base}`. Each sample's mean accuracy is in ab.json."])
    print((HERE / "ab.md").read_text())
    return results


if __name__ == "__main__":
    main()
