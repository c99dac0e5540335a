"""A whole fleet on one machine: the same algorithm objects and round loop, in-memory transport."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgefl.algorithms import (
    DeviceContext,
    DeviceRecord,
    ServerContext,
    TrainSettings,
    get_algorithm,
)
from edgefl.config import RunConfig
from edgefl.data import ArrayDataset, carve_public, load_dataset, partition
from edgefl.errors import ConfigError
from edgefl.export.checkpoint import save_device_models
from edgefl.models import ModelSpec, family_tiers
from edgefl.report import RunRecorder
from edgefl.report.recorder import finish_run, run_summary
from edgefl.runtime.agent import DeviceAgent
from edgefl.runtime.loop import LoopSettings, RoundLoop
from edgefl.transport import InMemoryTransport

log = logging.getLogger(__name__)


def derive_seed(seed: int, name: str) -> int:
    """A stable 31-bit seed for ``name`` (a device id) under the run seed."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:4], "little") & 0x7FFFFFFF


def device_ids(n: int) -> list[str]:
    width = max(2, len(str(n - 1)))
    return [f"d{i:0{width}d}" for i in range(n)]


def subsample(data: ArrayDataset, n: int | None, seed: int) -> ArrayDataset:
    if n is None or n >= len(data):
        return data
    idx = np.sort(np.random.default_rng([seed, 99]).choice(len(data), size=n, replace=False))
    return data.subset(idx)


def fleet_specs(
    cfg: RunConfig, ids: list[str], info, device_tiers: dict[str, str] | None = None
) -> dict[str, ModelSpec]:
    """Tiers from ``device_tiers`` (a fleet file's tier policy), else round-robin over devices
    (device i gets tier i mod #tiers)."""
    tiers = list(cfg.tiers) if cfg.tiers else family_tiers(cfg.model)
    options = tuple(sorted(cfg.model_options.items()))
    return {
        d: ModelSpec(
            family=cfg.model,
            tier=device_tiers[d] if device_tiers else tiers[i % len(tiers)],
            num_classes=info.num_classes,
            in_shape=tuple(info.in_shape),
            width=cfg.width,
            feature_dim=cfg.feature_dim,
            head=cfg.head,
            mean=tuple(info.mean),
            std=tuple(info.std),
            options=options,
        )
        for i, d in enumerate(ids)
    }


def profiled_tiers(cfg: RunConfig, fleet, info, shard_sizes: dict[str, int]) -> dict[str, str]:
    """Each device's tier by the profiling module's tier policy (``--fleet``)."""
    from edgefl.profiling import fleet_tiers

    tiers = list(cfg.tiers) if cfg.tiers else family_tiers(cfg.model)
    template = fleet_specs(cfg, fleet.ids[:1], info, {fleet.ids[0]: tiers[0]})[fleet.ids[0]]
    samples = {
        d: cfg.steps * cfg.batch_size if cfg.steps else cfg.epochs * n for d, n in shard_sizes.items()
    }
    optimizer = "adam" if cfg.optimizer == "adam" else "sgd-momentum" if cfg.momentum else "sgd"
    return fleet_tiers(
        fleet, template, tiers, batch_size=cfg.batch_size, samples_per_round=samples, optimizer=optimizer
    )


def train_settings(cfg: RunConfig) -> TrainSettings:
    return TrainSettings(
        epochs=cfg.epochs,
        steps=cfg.steps,
        batch_size=cfg.batch_size,
        optimizer=cfg.optimizer,
        lr=cfg.lr,
        momentum=cfg.momentum,
        weight_decay=cfg.weight_decay,
        lr_decay_rounds=tuple(cfg.lr_decay_rounds),
        lr_gamma=cfg.lr_gamma,
    )


def evaluation_split(cfg: RunConfig, train: ArrayDataset) -> tuple[ArrayDataset, ArrayDataset]:
    """(training pool, evaluation set): the test split, or with ``validation_samples`` a stratified
    validation set carved from the training data (for tuning defaults; the test set is then never
    read)."""
    if not cfg.validation_samples:
        return train, subsample(load_dataset(cfg.dataset, "test", cfg.data_dir), cfg.test_samples, cfg.seed + 1)
    if cfg.validation_samples >= len(train):
        raise ConfigError(f"validation_samples={cfg.validation_samples} leaves no training data of {len(train)}")
    val_idx, rest = carve_public(train.y.numpy(), cfg.validation_samples / len(train), seed=cfg.seed + 7)
    return train.subset(rest), train.subset(val_idx)


def run_dir_for(cfg: RunConfig) -> Path:
    name = cfg.run_name or f"{datetime.now():%Y%m%d-%H%M%S}-{cfg.algorithm}-{cfg.dataset}-s{cfg.seed}"
    return Path(cfg.out_dir) / name


def simulate(
    cfg: RunConfig, on_round: Callable[[dict[str, Any]], None] | None = None, *, plots: bool = True
) -> dict[str, Any]:
    """Run ``cfg`` in memory; writes config, rounds.jsonl, summary and (``plots``) plots to the run dir."""
    t_start = time.perf_counter()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    algorithm = get_algorithm(cfg.algorithm)
    options = algorithm.parse_options(cfg.options)
    fleet_file = None
    if cfg.fleet_file:  # device profiles whose tiers the tier policy chooses
        from edgefl.profiling import read_fleet

        fleet_file = read_fleet(cfg.fleet_file)
        if len(fleet_file.ids) != cfg.clients:
            raise ConfigError(
                f"fleet file {cfg.fleet_file} has {len(fleet_file.ids)} devices, but clients={cfg.clients}"
            )

    train = subsample(load_dataset(cfg.dataset, "train", cfg.data_dir), cfg.train_samples, cfg.seed)
    train, test = evaluation_split(cfg, train)
    quick = subsample(test, cfg.eval_samples, cfg.seed + 2)
    labels = train.y.numpy()
    public_fraction = algorithm.public_fraction if cfg.public_fraction is None else cfg.public_fraction
    public = None
    pool = np.arange(len(train))
    if public_fraction > 0:
        public_idx, pool = carve_public(labels, public_fraction, seed=cfg.seed)
        public = train.subset(public_idx)
    parts = partition(
        labels[pool],
        cfg.clients,
        cfg.partition,
        alpha=cfg.alpha,
        classes_per_client=cfg.classes_per_client,
        seed=cfg.seed,
        min_size=cfg.min_size,
    )
    ids = fleet_file.ids if fleet_file else device_ids(cfg.clients)
    device_tiers = None
    if fleet_file:
        sizes = {d: len(idx) for d, idx in zip(ids, parts, strict=True)}
        device_tiers = profiled_tiers(cfg, fleet_file, train.info, sizes)
    specs = fleet_specs(cfg, ids, train.info, device_tiers)
    settings = train_settings(cfg)

    # a method's options may say that devices hold the server's pool too (FedHeNN rad_source=device)
    devices_hold_public = bool(getattr(options, "devices_hold_public", False))
    transport = InMemoryTransport()
    eval_cache: dict = {}
    fleet: dict[str, DeviceRecord] = {}
    halves = {}
    for d, idx in zip(ids, parts, strict=True):
        data = train.subset(pool[idx])
        ctx = DeviceContext(d, specs[d], data, settings, derive_seed(cfg.seed, d), cfg.rounds,
                            public=public if devices_hold_public else None)
        half = algorithm.device(ctx, options)
        halves[d] = half
        agent = DeviceAgent(
            half, eval_sets={"quick": quick, "test": test}, algorithm=cfg.algorithm, eval_cache=eval_cache
        )
        transport.connect(d, agent.handle_bytes)
        fleet[d] = DeviceRecord(spec=specs[d], num_samples=len(data))

    server_ctx = ServerContext(
        num_classes=train.info.num_classes,
        fleet=fleet,
        settings=settings,
        rounds=cfg.rounds,
        seed=cfg.seed,
        fraction=cfg.fraction,
        min_devices=cfg.min_devices,
        public=public,
    )
    server = algorithm.server(server_ctx, options)
    run_dir = run_dir_for(cfg)
    recorder = RunRecorder(run_dir)
    recorder.write_config(
        {
            **cfg.model_dump(mode="json"),
            "resolved_options": {k: getattr(options, k) for k in vars(options)} if vars(options) else {},
            "fleet": {d: {"spec": specs[d].to_dict(), "num_samples": fleet[d].num_samples} for d in ids},
            **({"profiles": {d: p.name for d, p in fleet_file.devices}} if fleet_file else {}),
            "public_samples": 0 if public is None else len(public),
        }
    )
    rounds: list[dict[str, Any]] = []

    def record(r: dict[str, Any]) -> None:
        rounds.append(r)
        recorder.append_round(r)
        if on_round:
            on_round(r)

    loop = RoundLoop(
        server,
        server_ctx,
        transport,
        LoopSettings(rounds=cfg.rounds, algorithm=cfg.algorithm, eval_every=cfg.eval_every, timeout=cfg.timeout),
        on_round=record,
    )
    final = loop.run()
    # Each device's final model, for `edgefl export` (safetensors with the spec in its metadata).
    save_device_models(run_dir, {d: h.model for d, h in halves.items()}, specs=specs, dataset=cfg.dataset)
    summary = run_summary(
        cfg, final, rounds, {d: s.tier for d, s in specs.items()},
        test_samples=len(test), wall_seconds=time.perf_counter() - t_start, run_dir=run_dir,
    )
    finish_run(recorder, summary, plots=plots)
    return summary
