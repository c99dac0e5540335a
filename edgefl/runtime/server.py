"""The server process of a real fleet: registration, tier assignment, then the one round loop.

    summary = serve(cfg, ServeOptions(broker="mqtt://127.0.0.1:1883", fleet="lab", deadline=120,
                                       checkpoint_dir=Path("ck")))

``cfg`` is the same :class:`~edgefl.config.RunConfig` ``edgefl simulate`` uses (algorithm and
options, model family/tiers/width, training settings, rounds, fraction, min_fit, seed); the
dataset named there only gives the models their input shape and classes (and the server's public
share for methods that hold one). Devices bring their own data.

Registration: a device sends ``register`` with its profile (and maybe a requested tier); the
server answers ``assign`` with its model spec, chosen by the one tier policy of
:mod:`edgefl.profiling` (``choose_tier``: the largest tier that fits the device's memory and the
round deadline) unless the device asked for a tier of the run; the device builds its model and
registers again as ready; ready devices join ``ctx.fleet`` between rounds (the loop's
``before_round`` hook), so devices can join mid-run. The server waits for ``min_devices`` ready
devices before the first round (a start threshold only: each round trains ``fraction`` of the
ready devices, at least ``min_fit``), then runs :class:`~edgefl.runtime.loop.RoundLoop` over
:class:`~edgefl.transport.mqtt.MqttServerTransport`. With a checkpoint directory it checkpoints
after every round and, restarted, resumes from the last completed one (devices re-register with
the new server epoch and keep their models when the assignment is unchanged).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgefl.algorithms import DeviceRecord, ServerHalf
from edgefl.config import RunConfig
from edgefl.data import dataset_info
from edgefl.errors import (
    ConfigError,
    EdgeflError,
    RunRejectedError,
    TransportError,
    WireError,
)
from edgefl.models import ModelSpec
from edgefl.runtime import checkpoint
from edgefl.runtime.claims import DEFAULT_WEIGHT_RATIO
from edgefl.runtime.derived import run_dir_for, run_tiers, train_settings
from edgefl.runtime.ending import Availability, FinalProgress, ModelArrays, save_final_models
from edgefl.runtime.method import Method, resolve_method
from edgefl.runtime.run import Ending, RunLifecycle, loop_settings
from edgefl.runtime.setup import (
    build_server,
    check_aggregation,
    model_spec,
    server_context,
    server_optimizer,
    server_public,
)
from edgefl.runtime.status import FleetStatus, ObservedTransport, StatusPublisher, result_of
from edgefl.transport.base import Encoded
from edgefl.transport.broker import DEVICE_ID
from edgefl.transport.mqtt import BrokerAddress, MqttServerTransport
from edgefl.wire import Envelope, Limits, Payload, decode, encode
from edgefl.wire.validate import parse_profile

log = logging.getLogger(__name__)

REGISTER_LIMITS = Limits(max_bytes=1024 * 1024, max_tensors=0)


@dataclass
class ServeOptions:
    broker: str
    fleet: str = "default"
    deadline: float = 120.0  # seconds a round (and an evaluation) waits for its devices
    checkpoint_dir: Path | None = None
    wait_for_devices: float | None = None  # seconds to wait for min_devices (None: forever)
    max_bytes: int = Limits().max_bytes
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None  # TLS: the fleet CA, and this server's client certificate and key
    cert_file: str | None = None
    key_file: str | None = None
    # fleet status: seconds without a connection before a device is "gone" (None: deadline)
    gone_after: float | None = None
    # seconds the final evaluation waits (None: twice the deadline)
    final_deadline: float | None = None
    # test samples each device evaluates at the end (None: its whole test split)
    test_samples: int | None = None
    # tier policy: share of a device's available memory training may use
    memory_fraction: float = 0.5
    # no device weighs more than this × the median declared size (0: off)
    max_weight_ratio: float = DEFAULT_WEIGHT_RATIO
    # serve the fleet status as Prometheus metrics on this port (edgefl.report.metrics)
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"


class Registry:
    """Registrations → assignments → ready devices. Thread-safe (called on the network thread)."""

    def __init__(self, cfg: RunConfig, spec_for: Callable[[str], ModelSpec], epoch: str,
                 public_fraction: float, opts: ServeOptions, classes: tuple[str, ...] = ()):
        self.cfg, self.spec_for, self.epoch, self.public_fraction, self.opts = (
            cfg, spec_for, epoch, public_fraction, opts)
        # the run's class names, told to each device with its assignment
        self.classes = tuple(classes)
        self.tiers = run_tiers(cfg)
        self.settings = train_settings(cfg)
        self.lock = threading.Condition()
        self.assigned: dict[str, ModelSpec] = {}
        self.profiles: dict[str, dict[str, Any]] = {}
        self.ready: dict[str, DeviceRecord] = {}
        self.joined: set[str] = set()  # ready devices already in the loop's fleet
        # device → the registration epoch its size was declared in
        self.incarnations: dict[str, str] = {}
        self.rejected = 0

    def choose_tier(self, device_id: str, requested: str | None, profile: dict[str, Any]) -> str:
        if requested:
            if requested not in self.tiers:
                raise RunRejectedError(
                    f"device {device_id} asked for tier {requested!r}; this run has "
                    f"{', '.join(self.tiers)}")
            return requested
        if len(self.tiers) == 1:
            return self.tiers[0]
        from edgefl.profiling import DeviceProfile, TierBudget, choose_tier

        template = self.spec_for(self.tiers[0])
        samples = (self.settings.steps or 0) * self.settings.batch_size or 1000
        budget = TierBudget(
            memory_fraction=self.opts.memory_fraction,
            round_seconds=self.opts.deadline / 2,
            batch_size=self.settings.batch_size,
            samples_per_round=samples,
            optimizer="adam" if self.settings.optimizer == "adam"
            else ("sgd-momentum" if self.settings.momentum else "sgd"),
        )
        try:
            return choose_tier(DeviceProfile.from_dict(profile), template, self.tiers, budget)
        except EdgeflError as e:
            log.warning("device %s: unusable profile (%s); assigning the smallest tier", device_id,
                        e)
            return self.tiers[0]

    def warm_up(self) -> None:
        """Cost estimates build models; do it here, not on the network thread mid-run."""
        if len(self.tiers) > 1:
            from edgefl.profiling import model_cost

            for tier in self.tiers:
                model_cost(self.spec_for(tier))

    def handle(self, device_id: str, data: bytes) -> bytes | None:
        """A registration message → the assignment to send back (None: ignore).

        The message is decoded with the envelope's bounded machinery (its metadata against the
        closed :class:`~edgefl.wire.schema.RegisterMeta`, the profile by
        :func:`~edgefl.wire.validate.parse_profile`); any defect is a WireError, logged and counted
        in :attr:`rejected`. A ready device's data size is declared once per registration epoch
        (its ``incarnation``, new each time its process starts): a different count in the same
        epoch is refused and the declared one kept; in a new epoch it is taken and logged with
        the old and new values (the loop's weight bound still clips what it may weigh)."""
        try:
            if not DEVICE_ID.match(device_id):
                raise WireError(f"invalid device id {device_id[:80]!r}")
            env = decode(data, REGISTER_LIMITS)
            if env.kind != "register" or env.device_id != device_id:
                raise WireError(
                    f"a {env.kind!r} message for {env.device_id!r} on {device_id!r}'s "
                    "registration topic")
            meta = env.payload.meta
            epoch = meta.get("epoch")
            if epoch is not None and epoch != self.epoch:
                log.info("ignoring a registration of %s for an earlier server (%s)", device_id,
                         epoch)
                return None
            profile = parse_profile(meta.get("profile", "{}"))
            requested = str(meta["tier"]) if meta.get("tier") else None
            ready = bool(meta.get("ready", False))
            incarnation = str(meta.get("incarnation") or "")
            with self.lock:
                spec = self.assigned.get(device_id)
                before = self.ready.get(device_id)
                if ready and before is not None and before.num_samples != meta["num_samples"]:
                    if not incarnation or self.incarnations.get(device_id) == incarnation:
                        raise WireError(
                            f"device {device_id} re-declared {meta['num_samples']} samples "
                            "without a new registration epoch "
                            f"(declared {before.num_samples}); the declared size "
                            "stands"
                        )
                    log.warning(
                        "device %s re-registered (registration epoch %s) declaring %d samples, "
                        "was %d",
                        device_id,
                        incarnation or "-",
                        meta["num_samples"],
                        before.num_samples,
                    )
            if spec is None or (requested and requested != spec.tier):
                spec = self.spec_for(self.choose_tier(device_id, requested, profile))
            with self.lock:
                self.assigned[device_id] = spec
                self.profiles[device_id] = profile
                if ready:
                    # present: RegisterMeta requires it of a ready device
                    num_samples = int(meta["num_samples"])
                    if device_id not in self.ready:
                        log.info("device %s is ready: %s, %d samples", device_id, spec.name,
                                 num_samples)
                    self.incarnations[device_id] = incarnation
                    self.ready[device_id] = DeviceRecord(spec=spec, num_samples=num_samples,
                                                         profile=profile)
                    self.lock.notify_all()
        except RunRejectedError as e:  # a valid request the run cannot serve: tell the device why
            with self.lock:
                self.rejected += 1
            log.warning("rejected a registration from %s: %s", device_id, e)
            return encode(Envelope("assign", 0, device_id, fleet=self.opts.fleet,
                                   payload=Payload({}, {"rejected": str(e), "epoch": self.epoch})))
        except WireError as e:
            with self.lock:
                self.rejected += 1
            log.warning("rejected a registration from %s: %s", device_id, e)
            return None
        from edgefl.runtime.assignment import Assignment

        a = Assignment(spec, self.cfg.algorithm, dict(self.cfg.options), self.settings,
                       self.cfg.rounds, self.cfg.seed, self.public_fraction, self.epoch, ready,
                       self.classes)
        return encode(Envelope("assign", 0, device_id, fleet=self.opts.fleet, tier=spec.tier,
                               payload=Payload({}, a.to_meta())))

    def wait_ready(self, n: int, timeout: float | None,
                   on_progress: Callable[..., None] | None = None) -> None:
        end = None if timeout is None else time.monotonic() + timeout
        last_log = 0.0
        with self.lock:
            while len(self.ready) < n:
                if on_progress is not None:  # twice a second: the reader decides what to show
                    on_progress("register", None, len(self.ready), n, names=sorted(self.ready))
                if end is not None and time.monotonic() > end:
                    raise TransportError(
                        f"only {len(self.ready)} of {n} devices registered within {timeout:g} s")
                if time.monotonic() - last_log > 10:
                    log.info("waiting for devices: %d of %d ready", len(self.ready), n)
                    last_log = time.monotonic()
                self.lock.wait(0.5)
            if on_progress is not None:
                on_progress("register", None, len(self.ready), n, names=sorted(self.ready))

    def apply(self, fleet: dict[str, DeviceRecord]) -> None:
        """Add devices that became ready (or re-registered) to the loop's live fleet."""
        with self.lock:
            for device_id, record in self.ready.items():
                if device_id not in fleet:
                    log.info("device %s joins the run", device_id)
                fleet[device_id] = record


def serve(
    cfg: RunConfig,
    opts: ServeOptions,
    *,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    on_started: Callable[[MqttServerTransport], None] | None = None,
    on_done: Callable[[ServerHalf], None] | None = None,
    on_progress: Callable[..., None] | None = None,
    say: Callable[[str], None] | None = None,
    method: Method | None = None,
) -> dict[str, Any]:
    """Run a federated job over MQTT; returns the same summary as ``simulate``. ``on_progress``
    follows the registration ("register": ready devices of ``min_devices``, with their names)
    and each exchange (:class:`~edgefl.runtime.loop.RoundLoop`); ``say`` gets the final
    evaluation's lines (default: the log). Ctrl-C ends the run with the rounds completed: the
    record is written, marked interrupted, and RunInterrupted raised. ``method``: ``cfg``'s
    method as :func:`~edgefl.runtime.method.configure` resolved it (None: resolved here)."""
    say = say or log.info
    t_start = time.perf_counter()
    method = method or resolve_method(cfg.algorithm, cfg.options, cfg.public_fraction)
    # a server optimizer the method cannot take: refused before devices wait
    server_optimizer(cfg, method)
    check_aggregation(cfg, method)  # likewise --aggregation async
    info = dataset_info(cfg.dataset)
    public = server_public(cfg, method)  # carved exactly as every device carves it

    def spec_for(tier: str) -> ModelSpec:
        return model_spec(cfg, tier, info)

    limits = Limits(max_bytes=opts.max_bytes)
    address = (
        BrokerAddress.parse(opts.broker)
        .with_credentials(opts.username, opts.password)
        .with_tls(opts.ca_file, opts.cert_file, opts.key_file)
    )
    transport = MqttServerTransport(address, opts.fleet, limits=limits)
    registry = Registry(cfg, spec_for, transport.epoch, method.needs.public_share, opts,
                        info.class_names)
    registry.warm_up()
    run_dir = run_dir_for(cfg)
    status = FleetStatus(opts.fleet, run_name=run_dir.name, algorithm=cfg.algorithm,
                         rounds=cfg.rounds, deadline=opts.deadline,
                         gone_after=opts.gone_after)
    status.replied, status.last_seen = transport.replied, transport.last_seen.get
    status.epoch = transport.epoch
    status.waiting(0, cfg.min_devices)
    status.connection = lambda device_id: transport.status.get(device_id, "unknown")
    available = Availability(transport.status, transport.status_at)

    def on_register(device_id: str, data: bytes) -> bytes | None:
        answer = registry.handle(device_id, data)
        spec = registry.assigned.get(device_id)
        if answer is not None and spec is not None:
            available.registered(device_id)
            status.registered(device_id, spec.tier, spec.name, registry.profiles.get(device_id, {}))
            status.waiting(len(registry.ready), cfg.min_devices)
        return answer

    transport.on_register = on_register
    transport.start()
    publisher = StatusPublisher(status, transport.publish_fleet_status, run_dir).start()
    metrics = None
    if opts.metrics_port is not None:
        from edgefl.report.metrics import serve_metrics

        try:
            metrics, _ = serve_metrics(status.snapshot, opts.metrics_port, opts.metrics_host)
        except OSError as e:
            publisher.stop()
            transport.close()
            raise ConfigError(
                f"cannot serve metrics on {opts.metrics_host}:{opts.metrics_port}: "
                f"{e.strerror or e}"
            ) from None
    if on_started:
        on_started(transport)
    log.info("server %s of fleet %s is up on %s; waiting for %d devices", transport.epoch,
             opts.fleet, address, cfg.min_devices)
    phase = "stopped"  # what the retained server status says when this process leaves
    progress = FinalProgress(status, say)
    try:
        registry.wait_ready(cfg.min_devices, opts.wait_for_devices, on_progress)
        fleet: dict[str, DeviceRecord] = {}
        registry.apply(fleet)
        ctx = server_context(cfg, method, info.num_classes, fleet, public,
                             settings=registry.settings)
        server = build_server(method, ctx)
        settings = loop_settings(
            cfg,
            fleet=opts.fleet,
            run_id=transport.epoch,  # devices learn it at registration; replies must echo it
            timeout=opts.deadline,
            final_timeout=(opts.final_deadline if opts.final_deadline is not None
                           else 2 * opts.deadline),
            final_samples=opts.test_samples,
            finish_on_interrupt=True,
            interrupt_timeout=min(opts.deadline, 30.0),
            checkpoint_dir=opts.checkpoint_dir,
            stop_when_all_fail=False,  # a real fleet can be all offline for a round
            weight_ratio=opts.max_weight_ratio,
        )
        resuming = checkpoint.exists(opts.checkpoint_dir)
        life = RunLifecycle(cfg, method, run_dir, on_round=on_round, keep_rounds=resuming,
                            started=t_start)
        loop = life.loop(
            server,
            ctx,
            Encoded(ObservedTransport(transport, status), limits),
            settings,
            before_round=lambda r: (
                registry.apply(ctx.fleet),
                available.wait_for_any(sorted(ctx.fleet), opts.deadline),
            ),
            on_progress=on_progress,
            available=available,
            collect_models=None
            if method.privacy.on_device
            else ModelArrays(lambda d: ctx.fleet[d].spec),
            on_event=progress.on_event,
        )
        if loop.start_round:
            log.info("resuming after round %d from %s", loop.start_round, opts.checkpoint_dir)
        resumed_at = loop.start_round + 1 if loop.start_round else 0  # from 1; 0: not resumed

        def annotate(r: dict[str, Any]) -> None:
            stats = transport.take_stats()
            r["transport"] = {
                "published_down": stats.bytes_down,
                "received_up": stats.bytes_up,
                "retries": stats.retries,
                "dropped": stats.dropped,
                "rejected": stats.rejected,
                "wait_seconds": {d: max(0.0, s - r["train_seconds"].get(d, 0.0))
                                 for d, s in r.get("reply_seconds", {}).items()},
                # since the start: messages above the chunk threshold (edgefl.transport.chunks)
                "chunks_sent_total": dataclasses.asdict(transport.chunker.stats),
                "chunks_received_total": dataclasses.asdict(transport.reassembly.stats),
            }
            status.round_recorded(r)

        def config() -> dict[str, Any]:
            return {"transport": "mqtt", "broker": str(address), "fleet_name": opts.fleet,
                    "deadline": opts.deadline,
                    "final_deadline": settings.final_timeout, "resumed_at_round": resumed_at}

        def save_models(final: dict[str, Any]) -> dict[str, Any]:
            transport.announce_end()
            saved = save_final_models(run_dir, loop.final_models,
                                      {d: r.spec for d, r in ctx.fleet.items()}, cfg.dataset)
            missing = sorted(set(ctx.fleet) - set(saved))
            if method.privacy.on_device:
                say(
                    "local differential privacy: the devices keep their final models (none leaves "
                    "a device un-noised); "
                    "save or export them on each device (edgefl train --save-model, --export)"
                )
            elif missing:
                say(
                    f"no final model from {', '.join(missing)} (offline or past the deadline at "
                    "the end): "
                    f"{'they are' if len(missing) > 1 else 'it is'} left out of "
                    f"{run_dir / 'models'}"
                )
            return {"transport": "mqtt", "resumed_at_round": resumed_at,
                    "registrations_rejected": registry.rejected,
                    "models_saved": saved, "models_missing": missing}

        def ended(final: dict[str, Any], summary: dict[str, Any]) -> None:
            nonlocal phase
            phase = "interrupted" if final["interrupted"] else "finished"
            status.finished(None if final["interrupted"] else final, result_of(summary),
                            phase=phase)

        return life.run(
            Ending(config=config, annotate=annotate, save_models=save_models, ended=ended), on_done)
    except KeyboardInterrupt:  # before the first round (or while the record was written)
        phase = "interrupted"
        status.finished(None, phase="interrupted")
        raise
    finally:
        progress.close()
        if metrics is not None:
            metrics.shutdown()
            metrics.server_close()
        publisher.stop()
        transport.left_as(phase)
        transport.close()
