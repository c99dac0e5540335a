"""Diagnostic: where does the federated ψ collapse? One small FedVTC run (the benchmark's fleet
shape, fewer devices and rounds), then the oracle's share of samples assigned to the intended
class for four generators, each decoding latents v ~ N(c, diag σ²):

- ``averaged ψ, global c`` (what FedVTC fine-tunes on), BN in eval mode, and in train mode
  (batch statistics of the generated batch instead of the averaged running ones);
- ``own ψ_k, global c``: each device's decoder before averaging;
- ``own ψ_k, own c``: each device's decoder on its own class means (eval mode).

Plus, per device, the mean distance of its class means from the global prototypes against the
mean within-class spread of its latents (is z pulled onto c at all?).

    python -m benchmarks.fedvtc.investigations.collapse [--tc-weight W] [--lr LR]
        [--optimizer sgd|adam] [--rounds R]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
import torch

from benchmarks.fedvtc import oracle
from benchmarks.runner import ROOT
from edgefl.algorithms import get_algorithm
from edgefl.algorithms.fedvtc import (
    FedVTCServer,
    VTCDecoder,
    feature_statistics,
    generate,
    load_decoder,
    load_oracle,
)
from edgefl.config import resolve_config
from edgefl.runtime.setup import assemble


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tc-weight", default="0.001")
    p.add_argument("--align-weight", default="none")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--optimizer", default="sgd")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--clients", type=int, default=5)
    p.add_argument(
        "--option", "-o", action="append", default=[], help="another FedVTC option key=value"
    )
    args = p.parse_args()
    torch.set_num_threads(1)
    stash: dict[str, dict] = {}
    original = FedVTCServer.average_psi

    def keep(self, uplinks):  # the devices' own ψ_k, before the average
        for d, payload in uplinks.items():
            if (a := self.valid_psi(d, payload)) is not None:
                stash[d] = a
        return original(self, uplinks)

    FedVTCServer.average_psi = keep
    cfg = resolve_config(
        {
            "algorithm": "fedvtc",
            "dataset": "fashion-mnist",
            "tiers": ("1", "2", "3", "4", "5"),
            "width": 0.25,
            "feature_dim": 980,
            "clients": args.clients,
            "fraction": 1.0,
            "rounds": args.rounds,
            "epochs": 1,
            "optimizer": args.optimizer,
            "lr": args.lr,
            "momentum": 0.0,
            "batch_size": 16,
            "train_samples": 600 * args.clients,
            "test_samples": 500,
            "eval_samples": 500,
            "eval_every": args.rounds,
            "seed": 0,
            "partition": "dirichlet",
            "alpha": 1.0,
            "out_dir": "/tmp/edgefl-collapse",
            "run_name": "run",
            "threads": 1,
            "options": {
                "tc_weight": args.tc_weight,
                "align_weight": args.align_weight,
                "finetune_epochs": "0",
                **dict(o.split("=", 1) for o in args.option),
            },
        },
        dict(get_algorithm("fedvtc").defaults),
    )
    from edgefl.runtime.simulation import simulate

    servers = []
    summary = simulate(cfg, plots=False, on_done=servers.append)
    server = servers[0]
    run = assemble(cfg)
    spec = run.specs
    judge = load_oracle(ROOT / oracle.PATH, next(iter(spec.values())), 10)
    protos = torch.from_numpy(server.table.values.astype(np.float32))
    sigma = torch.from_numpy(server.sigma)
    classes = np.flatnonzero(server.table.known).tolist()

    @torch.no_grad()
    def share(psi: VTCDecoder, c: torch.Tensor, train_bn: bool = False) -> float:
        if train_bn:  # generate's draw, decoded with the batch's own BN statistics
            y = torch.tensor(classes).repeat_interleave(50)
            x = psi.train()(
                c[y]
                + sigma
                * torch.randn(len(y), c.shape[1], generator=torch.Generator().manual_seed(0))
            )
            psi.eval()
        else:
            x, y = generate(psi, c, sigma, classes, 50, torch.Generator().manual_seed(0))
        return float((judge(x).argmax(1) == y).float().mean())

    print(
        f"run: {summary['mean_accuracy'] * 100:.1f} % before any fine-tune; tc_weight "
        f"{args.tc_weight}, align_weight {args.align_weight}, "
        f"{args.optimizer} lr {args.lr}, {args.rounds} rounds, {args.clients} devices"
    )
    avg = load_decoder(server.layout, server.psi)
    print(f"averaged ψ, global c, BN eval: oracle {100 * share(avg, protos):.0f} %")
    print(f"averaged ψ, global c, BN train: oracle {100 * share(avg, protos, True):.0f} %")
    from edgefl.export.checkpoint import load_device_model

    for d in sorted(stash):
        model = load_device_model(cfg.out_dir + "/run", d)
        data = run.data.shard(run.ids.index(d))
        means, spread = feature_statistics(model, data)
        own = protos.clone()
        for c, m in means.items():
            own[c] = torch.from_numpy(m)
        dist = statistics.fmean(
            float(np.linalg.norm(m - server.table.values[c])) for c, m in means.items()
        )
        within = float(np.sqrt((spread ** 2).sum()))
        psi = load_decoder(server.layout, stash[d])
        print(
            f"{d} (tier {spec[d].tier}): own ψ_k, global c: oracle {100 * share(psi, protos):.0f} "
            "%; "
            f"own ψ_k, own c: {100 * share(psi, own):.0f} %; ‖own mean − c‖ {dist:.2f} vs "
            f"within-class spread {within:.2f}"
        )


if __name__ == "__main__":
    main()
