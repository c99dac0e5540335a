"""CPU per training step of a demo-sized model: one process alone against K at once.

    python -m benchmarks.demo.concurrent_training [--counts 1,2,20] [--steps 40] [--repetitions 3]

Forks K processes that each train ResNet-18 at width 0.125 on 28×28 images (batch 50, Adam, one
torch thread: a demo device's local work) for STEPS steps after three warm-up steps; a sample is
the mean CPU milliseconds per step over the K processes (``time.process_time``). With K above the
core count the processes take turns on the cores, as the demo's 20 device processes do; against
K=1 this shows what sharing the cores costs in CPU for the same work. The counts alternate
(:mod:`benchmarks.timing`, the load before and after every sample), and the run writes
``concurrent_training.json`` and ``.md`` beside this file, each count's ratio to K=1 taken
side by side. The demo's floor (:mod:`benchmarks.demo.floor`) is K=1's CPU: what the demo's
devices would cost if the machine trained them one at a time per core at no extra cost.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from pathlib import Path

from benchmarks.timing import Timing

HERE = Path(__file__).resolve().parent


def train(steps: int, results) -> None:
    import torch

    from edgefl.models import ModelSpec, build_model

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model(ModelSpec("resnet", "18", num_classes=10, in_shape=(1, 28, 28),
                                  width=0.125))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.rand(50, 1, 28, 28), torch.randint(0, 10, (50,))

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(3):
        step()
    c0 = time.process_time()
    for _ in range(steps):
        step()
    results.put((time.process_time() - c0) / steps)


def mean_step_ms(k: int, steps: int) -> float:
    """One sample: K processes at once, the mean CPU milliseconds per step over them."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=train, args=(steps, results)) for _ in range(k)]
    for p in procs:
        p.start()
    per_step = [results.get() for _ in procs]
    for p in procs:
        p.join()
    return 1000 * sum(per_step) / k


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--counts", default="1,2,20", help="process counts K, comma-separated")
    p.add_argument("--steps", type=int, default=40, help="measured steps per process")
    p.add_argument("--repetitions", type=int, default=3)
    args = p.parse_args(argv)
    counts = [int(k) for k in args.counts.split(",")]
    if 1 not in counts:
        raise SystemExit("--counts must include 1 (the baseline)")
    timing = Timing("CPU per training step: K demo devices training at once against one alone",
                    HERE, metric="cpu_ms_per_step", unit="ms", settings=vars(args))
    timing.alternate(
        "ResNet-18 at width 0.125, batch 50, one thread",
        {f"K={k}": (lambda k=k: mean_step_ms(k, args.steps)) for k in counts},
        args.repetitions, baseline="K=1",
        on_sample=lambda s: print(f"{s['variant']}: {s['value']} ms; load {s['load_after']}",
                                  flush=True))
    results = timing.write(name="concurrent_training", extra_md=[
        "", f"A sample: {args.steps} measured steps in each of K processes started together, "
        "the mean of their CPU milliseconds per step. K=1 is what the demo's floor assumes per "
        "device; the demo runs 20 device processes on this machine's cores."])
    print((HERE / "concurrent_training.md").read_text())
    return results


if __name__ == "__main__":
    main()
