"""One run assembly: from a validated run configuration to what every party of the run builds.

    run = assemble(cfg)                       # the in-memory simulation: every party at once
    half = run.device_half("d01")             # what device d01 trains with
    server = run.algorithm.server(run.server_context(fleet), run.options)

The three programs that start a run go through here and nowhere else:

- ``edgefl simulate`` (:mod:`edgefl.runtime.simulation`) calls :func:`assemble`;
- the MQTT server (:mod:`edgefl.runtime.server`) calls :func:`resolve_method`,
  :func:`server_public`, :func:`model_spec` and :func:`server_context`, and its simulated
  fleet (:mod:`edgefl.runtime.fleet`) :func:`plan_fleet`, as :func:`assemble` does;
- a device process (:mod:`edgefl.runtime.device`) calls :func:`build_device` with its
  :class:`DataSpec` and the server's assignment.

Data are made in one function, :func:`load_run_data` (subsample, carve the server's share,
partition), so a device process given shard *i* of a configuration holds exactly the samples,
the public pool and (by :func:`device_half`) the initial model that the simulated device *i*
holds. What a method needs from the run is its :class:`~edgefl.algorithms.base.MethodNeeds`
declaration, read here by :func:`resolve_method`.

Heavy libraries (torch, through the algorithms and the data loaders) are imported inside the
functions that use them, so importing this module stays cheap for the device CLI.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgefl.errors import ConfigError
from edgefl.privacy import PrivacySettings, Release, split_privacy_options
from edgefl.privacy.secagg import SecAggSettings, split_secagg_options
from edgefl.privacy.secagg_halves import SecAggDevice, SecAggServer, check_secagg, device_clip
from edgefl.runtime.dataspec import DataSpec

if TYPE_CHECKING:
    from edgefl.algorithms import (
        Algorithm,
        DeviceHalf,
        DeviceRecord,
        MethodNeeds,
        ServerContext,
        ServerHalf,
        ServerOptSettings,
        TrainSettings,
    )
    from edgefl.config import RunConfig
    from edgefl.data import ArrayDataset, DatasetInfo
    from edgefl.models import ModelSpec


# --- names, seeds and settings -------------------------------------------------------------------


def derive_seed(seed: int, name: str) -> int:
    """A stable 31-bit seed for ``name`` (a device id) under the run seed."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:4], "little") & 0x7FFFFFFF


def device_ids(n: int) -> list[str]:
    width = max(2, len(str(n - 1)))
    return [f"d{i:0{width}d}" for i in range(n)]


def run_dir_for(cfg: RunConfig) -> Path:
    name = cfg.run_name or f"{datetime.now():%Y%m%d-%H%M%S}-{cfg.algorithm}-{cfg.dataset}-s{cfg.seed}"
    return Path(cfg.out_dir) / name


def train_settings(cfg: RunConfig) -> TrainSettings:
    from edgefl.algorithms import TrainSettings

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


def run_tiers(cfg: RunConfig) -> list[str]:
    from edgefl.models import family_tiers

    return list(cfg.tiers) if cfg.tiers else family_tiers(cfg.model)


# --- the method ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Method:
    """A registered algorithm with its parsed options and what it needs from this run."""

    algorithm: Algorithm
    options: Any
    needs: MethodNeeds
    #: Differential privacy (the ``dp*`` options every method takes; off by default).
    privacy: PrivacySettings = PrivacySettings()
    #: Secure aggregation (the ``secagg*`` options of weight methods; off by default).
    secagg: SecAggSettings = SecAggSettings()

    @property
    def name(self) -> str:
        return self.algorithm.name

    def options_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self.options), **self.privacy.as_options(), **self.secagg.as_options()}

    @property
    def release(self) -> Release | None:
        """What the method's devices send, as its device half declares it for these options."""
        return self.algorithm.device.privacy_release(self.options)


    def total_rounds(self, rounds: int) -> int:
        """A run's exchanges: its training rounds and the closing rounds the method declares."""
        return rounds + self.needs.closing_rounds


def resolve_method(name: str, raw_options: dict[str, Any], public_share: float | None = None) -> Method:
    """The method ``name`` with ``raw_options`` parsed and its needs declared; ``public_share``
    (the run's ``public_fraction`` setting) overrides the share the method declares."""
    from edgefl.algorithms import get_algorithm

    return _method(get_algorithm(name), raw_options, public_share)


def configure(explicit: dict[str, Any]) -> tuple[RunConfig, Method]:
    """Settings given explicitly (a command's flags, a config file) → the validated run
    configuration over the algorithm's defaults, and its method: the algorithm is looked up and
    its options parsed once, here. ``simulate`` and ``serve`` take the method as it is."""
    from edgefl.algorithms import get_algorithm
    from edgefl.config import resolve_config

    algorithm = get_algorithm(explicit.get("algorithm", "fedavg"))
    cfg = resolve_config(explicit, dict(algorithm.defaults))
    return cfg, _method(algorithm, cfg.options, cfg.public_fraction)


def _method(algorithm: Algorithm, raw_options: dict[str, Any], public_share: float | None) -> Method:
    name = algorithm.name
    own, privacy = split_privacy_options(raw_options)
    own, secagg = split_secagg_options(own)
    options = algorithm.parse_options(own)
    needs = algorithm.needs_for(options)
    if public_share is not None and public_share != needs.public_share:
        if needs.devices_hold_public and public_share <= 0:
            raise ConfigError(f"{name} with these options has devices hold the public pool: public_fraction must be > 0")
        needs = dataclasses.replace(needs, public_share=public_share)
    method = Method(algorithm, options, needs, privacy, secagg)
    if secagg.on:
        check_secagg(name, method.release, options, privacy)
    if privacy.on:
        from edgefl.privacy.seam import check_release

        check_release(name, method.release, privacy, sgd_ready=algorithm.device.dp_sgd_ready)
    return method


# --- data ----------------------------------------------------------------------------------------


def subsample(data: ArrayDataset, n: int | None, seed: int) -> ArrayDataset:
    if n is None or n >= len(data):
        return data
    idx = np.sort(np.random.default_rng([seed, 99]).choice(len(data), size=n, replace=False))
    return data.subset(idx)


@dataclass
class RunData:
    """A run's data as one party sees it: the (subsampled) training set, the evaluation sets,
    the server's share carved out of the training set, and the partition of the rest."""

    train: ArrayDataset
    evals: dict[str, ArrayDataset]  # "quick" (per-round evaluation) and "test" (the final one)
    public: ArrayDataset | None
    pool: np.ndarray  # indices into ``train`` left to the devices
    parts: list[np.ndarray] | None  # per shard, indices into ``pool``; None: no partition

    @property
    def info(self) -> DatasetInfo:
        return self.train.info

    def shard(self, index: int) -> ArrayDataset:
        if self.parts is None:
            return self.train
        return self.train.subset(self.pool[self.parts[index]])


def evaluation_split(spec: DataSpec, train: ArrayDataset) -> tuple[ArrayDataset, ArrayDataset]:
    """(training pool, evaluation set): the test split, or with ``validation_samples`` a stratified
    validation set carved from the training data (for tuning defaults; the test set is then never
    read)."""
    from edgefl.data import carve_public, load_dataset

    if not spec.validation_samples:
        return train, subsample(load_dataset(spec.dataset, "test", spec.data_dir), spec.test_samples, spec.seed + 1)
    if spec.validation_samples >= len(train):
        raise ConfigError(f"validation_samples={spec.validation_samples} leaves no training data of {len(train)}")
    val_idx, rest = carve_public(train.y.numpy(), spec.validation_samples / len(train), seed=spec.seed + 7)
    return train.subset(rest), train.subset(val_idx)


def load_run_data(spec: DataSpec, public_share: float) -> RunData:
    """The one way a run's data are made. Without a shard in ``spec`` the party holds the whole
    (subsampled) training set and no public pool (a device on its own data)."""
    from edgefl.data import carve_public, load_dataset, partition

    public_share = public_share if spec.public is None else spec.public
    train = subsample(load_dataset(spec.dataset, "train", spec.data_dir), spec.train_samples, spec.seed)
    train, test = evaluation_split(spec, train)
    quick = subsample(test, spec.eval_samples, spec.seed + 2)
    evals = {"quick": quick, "test": test}
    pool = np.arange(len(train))
    if spec.shard is None:
        return RunData(train, evals, None, pool, None)
    labels = train.y.numpy()
    public = None
    if public_share > 0:
        public_idx, pool = carve_public(labels, public_share, seed=spec.seed)
        public = train.subset(public_idx)
    parts = partition(
        labels[pool], spec.shard[1], spec.partition, alpha=spec.alpha,
        classes_per_client=spec.classes_per_client, seed=spec.seed, min_size=spec.min_size,
    )
    return RunData(train, evals, public, pool, parts)


# --- models --------------------------------------------------------------------------------------


def model_spec(cfg: RunConfig, tier: str, info: DatasetInfo) -> ModelSpec:
    """The model of ``tier`` for ``cfg``'s family, width, head and dataset; under DP-SGD with
    GroupNorm for BatchNorm (``edgefl.models.norm``), unless the model options say otherwise."""
    from edgefl.models import ModelSpec, for_dp_sgd

    spec = ModelSpec(
        family=cfg.model,
        tier=tier,
        num_classes=info.num_classes,
        in_shape=tuple(info.in_shape),
        width=cfg.width,
        feature_dim=cfg.feature_dim,
        head=cfg.head,
        mean=tuple(info.mean),
        std=tuple(info.std),
        options=tuple(sorted(cfg.model_options.items())),
    )
    return for_dp_sgd(spec) if str(cfg.options.get("dp", "")).strip().lower() == "sgd" else spec


def fleet_specs(
    cfg: RunConfig, ids: list[str], info: DatasetInfo, device_tiers: dict[str, str] | None = None
) -> dict[str, ModelSpec]:
    """Tiers from ``device_tiers`` (a fleet file's tier policy), else round-robin over devices
    (device i gets tier i mod #tiers)."""
    tiers = run_tiers(cfg)
    return {d: model_spec(cfg, device_tiers[d] if device_tiers else tiers[i % len(tiers)], info) for i, d in enumerate(ids)}


def profiled_tiers(cfg: RunConfig, fleet, info: DatasetInfo, shard_sizes: dict[str, int]) -> dict[str, str]:
    """Each device's tier by the profiling module's tier policy (``--fleet``)."""
    from edgefl.profiling import fleet_tiers

    tiers = run_tiers(cfg)
    samples = {d: train_settings(cfg).visits(n) for d, n in shard_sizes.items()}
    optimizer = "adam" if cfg.optimizer == "adam" else "sgd-momentum" if cfg.momentum else "sgd"
    return fleet_tiers(
        fleet, model_spec(cfg, tiers[0], info), tiers, batch_size=cfg.batch_size, samples_per_round=samples, optimizer=optimizer
    )


# --- the parties ---------------------------------------------------------------------------------


def build_device(
    method: Method,
    device_id: str,
    spec: ModelSpec,
    data: RunData,
    shard: int,
    settings: TrainSettings,
    run_seed: int,
    rounds: int,
) -> DeviceHalf:
    """Device ``device_id``'s half: its model (seeded from the run seed and its id), its shard,
    and the server's pool when the method's needs say devices hold it."""
    from edgefl.algorithms import DeviceContext

    public = None
    if method.needs.devices_hold_public:
        if data.public is None:
            raise ConfigError(
                f"{method.name} with these options needs the public pool on the device: give --data a shard of a partitioned dataset"
            )
        public = data.public
    ctx = DeviceContext(device_id, spec, data.shard(shard), settings, derive_seed(run_seed, device_id), rounds, public=public)
    half = method.algorithm.device(ctx, method.options)
    if method.privacy.on_device:  # local DP: the device protects its uplink itself
        from edgefl.privacy.seam import PrivateDevice

        half = PrivateDevice(half, method.privacy, method.release, method.total_rounds(rounds))
    elif method.privacy.trains_privately:  # DP-SGD: the device trains with per-sample clipping and noise
        from edgefl.privacy.dpsgd import SgdDevice

        half = SgdDevice(half, method.privacy, method.release, method.total_rounds(rounds))
    if method.secagg.on:  # the update leaves the device masked; central DP's clip happens here
        half = SecAggDevice(half, method.secagg, device_clip(method.privacy, method.options))
    return half


def build_server(method: Method, ctx: ServerContext) -> ServerHalf:
    """The method's server half, with the privacy ledger (and central DP) when the run asks."""
    server = method.algorithm.server(ctx, method.options)
    if method.privacy.on:
        from edgefl.privacy.seam import PrivateServer

        server = PrivateServer(server, method.privacy, method.release, method.total_rounds(ctx.rounds))
    if method.secagg.on:
        server = SecAggServer(server, method.secagg, central_dp=method.privacy.mode == "central")
    return server


def server_public(cfg: RunConfig, method: Method) -> ArrayDataset | None:
    """The server's share of the training set, carved exactly as every device carves it."""
    if method.needs.public_share <= 0:
        return None
    # one shard: carving comes before partitioning, so the partition does not matter here
    whole = dataclasses.replace(DataSpec.from_config(cfg), shard=(0, 1), partition="iid")
    return load_run_data(whole, method.needs.public_share).public


def server_context(
    cfg: RunConfig, method: Method, num_classes: int, fleet: dict[str, DeviceRecord], public: ArrayDataset | None,
    *, settings: TrainSettings | None = None,
) -> ServerContext:
    from edgefl.algorithms import ServerContext

    return ServerContext(
        num_classes=num_classes,
        fleet=fleet,
        settings=settings or train_settings(cfg),
        rounds=cfg.rounds,
        seed=cfg.seed,
        fraction=cfg.fraction,
        min_fit=cfg.min_fit or 1,  # the start threshold (min_devices) is the server's, not the round's
        public=public,
        closing_rounds=method.needs.closing_rounds,
        finish_trains=method.needs.finish_trains,
        server_opt=server_optimizer(cfg, method),
    )


def server_optimizer(cfg: RunConfig, method: Method) -> ServerOptSettings:
    """The run's server optimizer; refused for a method that declares no averaged weights."""
    from edgefl.algorithms import ServerOptSettings

    settings = ServerOptSettings(
        cfg.server_opt, cfg.server_opt_lr, cfg.server_opt_betas[0], cfg.server_opt_betas[1], cfg.server_opt_eps
    )
    if not settings.averages_only and not method.needs.averages_weights:
        raise ConfigError(
            f"--server-opt {cfg.server_opt}: {method.name} with these options averages no model weights, "
            "so there is nothing for a server optimizer to step (methods that do: "
            f"{', '.join(weight_methods())})"
        )
    if not settings.averages_only and method.privacy.mode == "central":
        # the server's noise is calibrated to the clipped average's sensitivity and added to the
        # model after the method's aggregation: after a server optimizer's step that bound is not it
        raise ConfigError(f"--server-opt {cfg.server_opt} with --dp central is not supported: the noise is calibrated "
                          "for the plain average; use --dp local, or --server-opt fedavg")
    return settings


def registered_methods() -> list[tuple[str, MethodNeeds]]:
    """Every registered method with its declared needs at its default options."""
    from edgefl.algorithms import algorithm_names, get_algorithm

    out = []
    for name in algorithm_names():
        algorithm = get_algorithm(name)
        out.append((name, algorithm.needs_for(algorithm.parse_options({}))))
    return out


def weight_methods() -> list[str]:
    """The registered methods whose server averages weights with their default options."""
    return [name for name, needs in registered_methods() if needs.averages_weights]


@dataclass
class RunAssembly:
    """Every party of a run on one machine (the in-memory simulation)."""

    cfg: RunConfig
    method: Method
    settings: TrainSettings
    data: RunData
    ids: list[str]
    specs: dict[str, ModelSpec]
    fleet_file: Any = None  # profiling.Fleet when the tiers came from device profiles

    @property
    def algorithm(self) -> Algorithm:
        return self.method.algorithm

    @property
    def options(self) -> Any:
        return self.method.options

    def data_spec(self, device_id: str) -> DataSpec:
        """What a device process is given (``edgefl train --data``) to hold this device's data."""
        return DataSpec.from_config(self.cfg, self.ids.index(device_id))

    def device_half(self, device_id: str) -> DeviceHalf:
        return build_device(
            self.method, device_id, self.specs[device_id], self.data, self.ids.index(device_id),
            self.settings, self.cfg.seed, self.cfg.rounds,
        )

    def server_context(self, fleet: dict[str, DeviceRecord]) -> ServerContext:
        return server_context(self.cfg, self.method, self.data.info.num_classes, fleet, self.data.public, settings=self.settings)


def assemble(cfg: RunConfig, method: Method | None = None) -> RunAssembly:
    """``cfg``'s whole run: the method (``method``: as :func:`configure` resolved it), the data
    and its partition, each device's model spec."""
    method = method or resolve_method(cfg.algorithm, cfg.options, cfg.public_fraction)
    server_optimizer(cfg, method)  # refused before any data are loaded
    if cfg.aggregation == "async" and not method.needs.asynchronous:
        able = [m for m in registered_methods() if m[1].asynchronous]
        raise ConfigError(f"--aggregation async: {method.name} cannot aggregate updates as they arrive "
                          f"(methods that can: {', '.join(name for name, _ in able)})")
    if cfg.aggregation == "async" and method.secagg.on:
        raise ConfigError("--aggregation async with --secagg is not supported: secure aggregation sums a synchronous round")
    if cfg.aggregation == "async" and method.privacy.mode == "central":
        raise ConfigError("--aggregation async with --dp central is not supported: the server's privacy ledger "
                          "and budget check work per synchronous round; use --dp local")
    data = load_run_data(DataSpec.from_config(cfg), method.needs.public_share)
    plan = plan_fleet(cfg, method, data)
    specs = fleet_specs(cfg, plan.ids, data.info, plan.tiers)
    return RunAssembly(cfg, method, train_settings(cfg), data, plan.ids, specs, plan.fleet_file)


@dataclass(frozen=True)
class FleetPlan:
    """A simulated fleet, in memory or over MQTT: its device ids (in shard order) and tiers."""

    ids: list[str]
    tiers: dict[str, str]
    fleet_file: Any = None  # profiling.Fleet when the tiers came from device profiles

    def profiles(self) -> dict[str, dict[str, Any]]:
        """Each device's profile from the fleet file (none without one)."""
        return {d: p.to_dict() for d, p in self.fleet_file.devices} if self.fleet_file else {}


def plan_fleet(cfg: RunConfig, method: Method, data: RunData | None = None) -> FleetPlan:
    """The devices of ``cfg``'s fleet file with the tiers its tier policy chooses for their
    shards of ``data`` (loaded here when not given), or without one ``clients`` devices d00, d01,
    … with the run's tiers in turn (device i gets tier i mod #tiers)."""
    if not cfg.fleet_file:
        tiers = run_tiers(cfg)
        ids = device_ids(cfg.clients)
        return FleetPlan(ids, {d: tiers[i % len(tiers)] for i, d in enumerate(ids)})
    from edgefl.profiling import read_fleet

    fleet_file = read_fleet(cfg.fleet_file)
    if len(fleet_file.ids) != cfg.clients:
        raise ConfigError(f"fleet file {cfg.fleet_file} has {len(fleet_file.ids)} devices, but clients={cfg.clients}")
    if data is None:
        data = load_run_data(DataSpec.from_config(cfg), method.needs.public_share)
    sizes = {d: len(data.parts[i]) for i, d in enumerate(fleet_file.ids)}
    return FleetPlan(fleet_file.ids, profiled_tiers(cfg, fleet_file, data.info, sizes), fleet_file)
