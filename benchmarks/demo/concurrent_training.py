"""CPU per training step of a demo-sized model: one process alone against K at once.

    python -m benchmarks.demo.concurrent_training K STEPS

Forks K processes that each train ResNet-18 at width 0.125 on 28×28 images (batch 50, Adam, one
torch thread: a demo device's local work) for STEPS steps after three warm-up steps, and prints
the mean CPU seconds per step (``time.process_time``). With K above the core count the processes
take turns on the cores, as the demo's 20 device processes do; against K=1 this shows what the
turns cost in CPU for the same work (``benchmarks/demo/README.md``).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time


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


def main() -> None:
    k, steps = int(sys.argv[1]), int(sys.argv[2])
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=train, args=(steps, results)) for _ in range(k)]
    for p in procs:
        p.start()
    per_step = [results.get() for _ in procs]
    for p in procs:
        p.join()
    print(f"K={k}: {1000 * sum(per_step) / k:.1f} ms of CPU per step (mean over {k} processes, "
          f"{steps} steps each); load {[round(x, 2) for x in os.getloadavg()]}")


if __name__ == "__main__":
    main()
