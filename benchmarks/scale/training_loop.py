"""The training loop's cost: a FedAvg round through edgefl's whole device path against a bare
PyTorch loop on the same model, data and batches, side by side.

    python -m benchmarks.scale.training_loop [--repeats 5] [--threads N]

edgefl's side is one ``train`` request handled by :class:`~edgefl.runtime.agent.DeviceAgent`:
decoding and checking the downlink, loading the global weights, one epoch of local SGD through
``train_local`` (shuffled minibatches from ``local_batches``), the update's arrays and the encoded
reply. The bare side is the loop a PyTorch user writes: a permutation, index the tensors, zero_grad,
forward, cross-entropy, backward, step. Both run one epoch over the same 6,000 Fashion-MNIST
images at batch 32 with SGD (lr 0.01, momentum 0.9) from the same initial weights, alternating
(edgefl, bare, edgefl, …) so that load changes hit both; the ratio is of the medians. Writes
``benchmarks/scale/training_loop.json`` and ``.md``. Target (issue 22): edgefl ≥ 90 % of the bare
loop's images per second. (edgefl keeps images as uint8 and converts each batch, a quarter of the
memory; the bare loop is given float images converted once, so the comparison is the strict one.)
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.common import measure_models, models_page
from benchmarks.timing import command_line

HERE = Path(__file__).resolve().parent
MODELS = {  # name → run settings
    "cnn tier 2 (width 1)": {"model": "cnn", "tiers": ("2",), "width": 1.0},
    "resnet-18 (width 0.25)": {"model": "resnet", "tiers": ("18",), "width": 0.25},
}


def bare_epoch(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int, seed: int
) -> float:
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.train()
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    t0 = time.perf_counter()
    for i in range(0, len(y), batch):
        idx = order[i : i + batch]
        if len(idx) < 2:
            continue
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
    return time.perf_counter() - t0


def measure(name: str, settings: dict, repeats: int) -> dict:
    from edgefl.algorithms import DeviceRecord, get_algorithm
    from edgefl.config import resolve_config
    from edgefl.runtime.agent import DeviceAgent
    from edgefl.runtime.setup import assemble
    from edgefl.wire import Envelope, encode

    cfg = resolve_config(
        {
            "algorithm": "fedavg",
            "dataset": "fashion-mnist",
            "clients": 1,
            "partition": "iid",
            "train_samples": 6000,
            "test_samples": 100,
            "eval_samples": 100,
            "epochs": 1,
            "batch_size": 32,
            "optimizer": "sgd",
            "lr": 0.01,
            "momentum": 0.9,
            "seed": 0,
            **settings,
        },
        dict(get_algorithm("fedavg").defaults),
    )
    run = assemble(cfg)
    half = run.device_half("d00")
    server = run.algorithm.server(
        run.server_context(
            {"d00": DeviceRecord(spec=run.specs["d00"], num_samples=len(half.ctx.train_data))}
        ),
        run.options,
    )
    agent = DeviceAgent(half, algorithm=cfg.algorithm)
    initial = copy.deepcopy(half.model.state_dict())
    data = half.ctx.train_data
    # the bare loop holds float images in memory, converted once
    x, y = data.x.float().div_(255.0), data.y
    edgefl_s, bare_s = [], []
    for r in range(repeats):
        half.model.load_state_dict(initial)
        request = encode(
            Envelope(
                "train",
                r,
                "d00",
                algorithm=cfg.algorithm,
                tier=run.specs["d00"].tier,
                payload=server.downlink(r, "d00"),
                run="bench",
                nonce=f"n{r}",
            )
        )
        t0 = time.perf_counter()
        reply = agent.handle_bytes(request)
        edgefl_s.append(time.perf_counter() - t0)
        assert reply is not None and b'"update"' in reply[:4096], (
            "the device did not answer with an update"
        )
        bare = copy.deepcopy(half.model)
        bare.load_state_dict(initial)
        bare_s.append(bare_epoch(bare, x, y, cfg.batch_size, r))
    images = len(y)
    e, b = statistics.median(edgefl_s), statistics.median(bare_s)
    return {
        "model": name,
        "images": images,
        "repeats": repeats,
        "edgefl_seconds": [round(s, 3) for s in edgefl_s],
        "bare_seconds": [round(s, 3) for s in bare_s],
        "edgefl_images_per_s": round(images / e, 1),
        "bare_images_per_s": round(images / b, 1),
        "ratio": round(b / e, 3),
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    info = {"torch_threads": torch.get_num_threads(),
            "command": command_line("benchmarks.scale.training_loop", argv)}
    rows = (measure(name, settings, args.repeats) for name, settings in MODELS.items())
    return measure_models(HERE / "training_loop", page, info, rows)


#: The page's paragraph after how it was measured, and its table's columns.
ABOUT = (
    "One FedAvg round (one epoch of 6,000 Fashion-MNIST images, batch 32, SGD) through edgefl's "
    "device path (request decoded and checked, weights loaded, local training, update encoded) "
    "against the bare loop, alternating; medians."
)
COLUMNS = ("model", "edgefl (images/s)", "bare loop (images/s)", "edgefl ÷ bare", "target ≥ 0.90")


def page(results: dict) -> list[str]:
    return models_page(results, "The training loop against a bare PyTorch loop",
                       f"torch threads {results['torch_threads']}", ABOUT, COLUMNS, row)


def row(r: dict) -> tuple[str, ...]:
    return (
        r["model"], f"{r['edgefl_images_per_s']:.0f}", f"{r['bare_images_per_s']:.0f}",
        f"**{r['ratio']:.3f}**", "met" if r["ratio"] >= 0.9 else "not met",
    )


if __name__ == "__main__":
    main()
