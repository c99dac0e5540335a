"""One run assembly: from a validated run configuration to what every party of the run builds.

    run = assemble(cfg)                       # the in-memory simulation: every party at once
    half = run.device_half("d01")             # what device d01 trains with
    server = run.algorithm.server(run.server_context(fleet), run.options)

The three programs that start a run go through here and nowhere else:

- ``edgefl simulate`` (:mod:`edgefl.runtime.simulation`) calls :func:`assemble`;
- the MQTT server (:mod:`edgefl.runtime.server`) calls
  :func:`~edgefl.runtime.method.resolve_method`, :func:`server_public`, :func:`model_spec` and
  :func:`server_context`, and its simulated fleet (:mod:`edgefl.runtime.fleet`)
  :func:`plan_fleet`, as :func:`assemble` does;
- a device process (:mod:`edgefl.runtime.device`) calls :func:`build_device` with its
  :class:`DataSpec` and the server's assignment.

Data are made in one function, :func:`~edgefl.runtime.rundata.load_run_data` (subsample, carve
the server's share, partition), so a device process given shard *i* of a configuration holds
exactly the samples, the public pool and (by :func:`build_device`) the initial model that the
simulated device *i* holds. What a method needs from the run is its
:class:`~edgefl.algorithms.base.MethodNeeds` declaration (:mod:`edgefl.runtime.method`).

Heavy libraries (torch, through the algorithms and the data loaders) are imported inside the
functions that use them, so importing this module stays cheap for the device CLI.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgefl.errors import ConfigError
from edgefl.privacy.secagg_halves import SecAggDevice, SecAggServer, device_clip
from edgefl.runtime.dataspec import DataSpec
from edgefl.runtime.derived import derive_seed, device_ids, run_tiers, train_settings
from edgefl.runtime.method import Method, registered_methods, resolve_method, weight_methods
from edgefl.runtime.rundata import RunData, load_run_data

if TYPE_CHECKING:
    from edgefl.algorithms import (
        Algorithm,
        DeviceHalf,
        DeviceRecord,
        ServerContext,
        ServerHalf,
        ServerOptSettings,
        TrainSettings,
    )
    from edgefl.config import RunConfig
    from edgefl.data import ArrayDataset, DatasetInfo
    from edgefl.models import ModelSpec


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
    return {
        d: model_spec(cfg, device_tiers[d] if device_tiers else tiers[i % len(tiers)], info)
        for i, d in enumerate(ids)
    }


def profiled_tiers(cfg: RunConfig, fleet, info: DatasetInfo,
                   shard_sizes: dict[str, int]) -> dict[str, str]:
    """Each device's tier by the profiling module's tier policy (``--fleet``)."""
    from edgefl.profiling import fleet_tiers

    tiers = run_tiers(cfg)
    samples = {d: train_settings(cfg).visits(n) for d, n in shard_sizes.items()}
    optimizer = "adam" if cfg.optimizer == "adam" else "sgd-momentum" if cfg.momentum else "sgd"
    return fleet_tiers(
        fleet, model_spec(cfg, tiers[0], info), tiers, batch_size=cfg.batch_size,
        samples_per_round=samples, optimizer=optimizer
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
    compute: str = "cpu",
) -> DeviceHalf:
    """Device ``device_id``'s half: its model (seeded from the run seed and its id), its shard,
    and the server's pool when the method's needs say devices hold it; it trains on ``compute``
    (a torch device, resolved by ``edgefl.algorithms.training.resolve_compute``)."""
    from edgefl.algorithms import DeviceContext

    public = None
    if method.needs.devices_hold_public:
        if data.public is None:
            raise ConfigError(
                f"{method.name} with these options needs the public pool on the device: give "
                "--data a shard of a partitioned dataset"
            )
        public = data.public
    ctx = DeviceContext(
        device_id, spec, data.shard(shard), settings, derive_seed(run_seed, device_id), rounds,
        public=public, compute=compute,
    )
    half = method.algorithm.device(ctx, method.options)
    if method.privacy.on_device:  # local DP: the device protects its uplink itself
        from edgefl.privacy.seam import PrivateDevice

        half = PrivateDevice(half, method.privacy, method.release, method.total_rounds(rounds),
                             repeatable=method.repeatable_noise)
    # DP-SGD: the device trains with per-sample clipping and noise
    elif method.privacy.trains_privately:
        from edgefl.privacy.dpsgd import SgdDevice

        half = SgdDevice(half, method.privacy, method.release, method.total_rounds(rounds))
    if method.secagg.on:  # the update leaves the device masked; central DP's clip happens here
        half = SecAggDevice(half, method.secagg, device_clip(method.privacy, method.defences))
    return half


def build_server(method: Method, ctx: ServerContext) -> ServerHalf:
    """The method's server half, with the privacy ledger (and central DP) when the run asks."""
    server = method.algorithm.server(ctx, method.options)
    if method.privacy.on:
        from edgefl.privacy.seam import PrivateServer

        server = PrivateServer(server, method.privacy, method.release,
                               method.total_rounds(ctx.rounds), repeatable=method.repeatable_noise,
                               aggregator=method.defences.aggregator)
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
    cfg: RunConfig, method: Method, num_classes: int, fleet: dict[str, DeviceRecord],
    public: ArrayDataset | None,
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
        # the start threshold (min_devices) is the server's, not the round's
        min_fit=cfg.min_fit or 1,
        public=public,
        closing_rounds=method.needs.closing_rounds,
        uplink_deltas=method.needs.uplink_deltas,
        server_opt=server_optimizer(cfg, method),
    )


def server_optimizer(cfg: RunConfig, method: Method) -> ServerOptSettings:
    """The run's server optimizer; refused for a method that declares no averaged weights."""
    from edgefl.algorithms import ServerOptSettings

    settings = ServerOptSettings(
        cfg.server_opt, cfg.server_opt_lr, cfg.server_opt_betas[0], cfg.server_opt_betas[1],
        cfg.server_opt_eps
    )
    if not settings.averages_only and not method.needs.averages_weights:
        raise ConfigError(
            f"--server-opt {cfg.server_opt}: {method.name} with these options averages no model "
            "weights, "
            "so there is nothing for a server optimizer to step (methods that do: "
            f"{', '.join(weight_methods())})"
        )
    if not settings.averages_only and method.privacy.mode == "central":
        # the server's noise is calibrated to the clipped average's sensitivity and added to the
        # model after the method's aggregation: after a server optimizer's step that bound is not it
        raise ConfigError(
            f"--server-opt {cfg.server_opt} with --dp central is not supported: the noise is "
            "calibrated "
            "for the plain average; use --dp local, or --server-opt fedavg"
        )
    return settings


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
            self.settings, self.cfg.seed, self.cfg.rounds, compute=self.compute,
        )

    @functools.cached_property
    def compute(self) -> str:
        """The torch device every simulated device trains on (``--train-device``)."""
        from edgefl.algorithms.training import resolve_compute

        return resolve_compute(self.cfg.train_device)

    def server_context(self, fleet: dict[str, DeviceRecord]) -> ServerContext:
        return server_context(self.cfg, self.method, self.data.info.num_classes, fleet,
                              self.data.public, settings=self.settings)


def check_aggregation(cfg: RunConfig, method: Method) -> None:
    """``--aggregation async`` with a method, or an option, that cannot take it: ConfigError."""
    if cfg.aggregation != "async":
        return
    if not method.needs.asynchronous:
        able = [m for m in registered_methods() if m[1].asynchronous]
        raise ConfigError(f"--aggregation async: {method.name} cannot aggregate updates as they "
                          f"arrive (methods that can: {', '.join(name for name, _ in able)})")
    if method.secagg.on:
        raise ConfigError("--aggregation async with --secagg is not supported: "
                          "secure aggregation sums a synchronous round")
    if method.privacy.mode == "central":
        raise ConfigError("--aggregation async with --dp central is not supported: the server's "
                          "privacy ledger and budget check work per synchronous round; "
                          "use --dp local")


def assemble(cfg: RunConfig, method: Method | None = None) -> RunAssembly:
    """``cfg``'s whole run: the method (``method``: as :func:`configure` resolved it), the data
    and its partition, each device's model spec. A simulation repeats: its privacy noise comes
    from the run seed (``Method.repeatable_noise``)."""
    method = method or resolve_method(cfg.algorithm, cfg.options, cfg.public_fraction)
    method = dataclasses.replace(method, repeatable_noise=True)
    server_optimizer(cfg, method)  # refused before any data are loaded
    check_aggregation(cfg, method)
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
        raise ConfigError(
            f"fleet file {cfg.fleet_file} has {len(fleet_file.ids)} devices, but "
            f"clients={cfg.clients}")
    if data is None:
        data = load_run_data(DataSpec.from_config(cfg), method.needs.public_share)
    sizes = {d: len(data.parts[i]) for i, d in enumerate(fleet_file.ids)}
    return FleetPlan(fleet_file.ids, profiled_tiers(cfg, fleet_file, data.info, sizes), fleet_file)
