"""The demo against its floor, from one run: ``python -m benchmarks.demo.ratio [--repetitions N]``.

Alternates (:mod:`benchmarks.timing`, the load recorded before and after each sample) the demo's
training floor (:func:`benchmarks.demo.floor.floor_run`: its 20 devices trained in memory one at
a time at one thread, scaled to 12 rounds on this machine's cores) and the whole ``make demo``
(timed from outside, with this interpreter's venv: ``make demo VENV=<sys.prefix>``, this
checkout's ``edgefl`` first on ``PYTHONPATH``), and writes
``ratio.json`` and ``ratio.md`` beside this file: each sample, and make demo ÷ floor as the median
of the ratios of samples taken side by side (issue 39's target: ≤ 1.2). Then the demo page
(``README.md``, :mod:`benchmarks.demo.record`) is rewritten from the last ``runs/demo`` with its
wall time and that ratio.

On a shared machine both sides slow down, but not alike: the floor is one process, the demo 22
(the devices, the server, the broker), which take a larger share of contended cores. Read a
ratio taken under load with that in mind; the load of every sample is in ``ratio.json``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.demo import ab, record
from benchmarks.demo.floor import floor_run
from benchmarks.timing import Timing

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
TARGET = 1.2


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repetitions", type=int, default=1)
    p.add_argument("--floor-rounds", type=int, default=2,
                   help="rounds the floor measures (scaled to the demo's 12)")
    args = p.parse_args(argv)
    timing = Timing("make demo against its training floor", HERE, metric="seconds",
                    settings=vars(args))
    samples = timing.alternate(
        "demo", {"training floor": lambda: floor_run(args.floor_rounds),
                 "make demo": lambda: ab.make_demo(ROOT)},
        args.repetitions, baseline="training floor")
    ratio = timing.results["groups"]["demo"]["summary"]["make demo"].get("ratio_to_baseline")
    verdict = ("not measured" if not ratio else
               f"**{ratio['median']:.2f}×** (target ≤ {TARGET}: "
               f"**{'met' if ratio['median'] <= TARGET else 'not met'}**)")
    results = timing.write(name="ratio", extra_md=[
        "", f"make demo ÷ its training floor, side by side: {verdict}.", "",
        "The floor: the demo's devices trained in memory one at a time at one thread "
        "(`python -m benchmarks.demo.floor`), 12 × the mean CPU-seconds of a round ÷ cores."])
    demo = [s for s in samples if s["variant"] == "make demo" and s.get("value") is not None]
    if demo and ratio:
        last = demo[-1]
        record.main(["--seconds", f"{last['value']:.1f}",
                     "--load-before", " ".join(map(str, last["load_before"])),
                     "--load-after", " ".join(map(str, last["load_after"])),
                     "--floor-ratio", f"{ratio['median']:.3f}"])
    print((HERE / "ratio.md").read_text())
    return results


if __name__ == "__main__":
    main()
