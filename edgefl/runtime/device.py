"""The device process: connect, register with a profile, build the assigned model, serve rounds.

    run_device(DeviceOptions(broker="mqtt://127.0.0.1:1883", fleet="lab", device_id="pi-07",
                             data="fashion-mnist:shard=3/6,partition=dirichlet,alpha=0.5,seed=0"))

Life of a device:

1. connect (stable client id, persistent session, Last Will "offline" on its status topic);
2. register: a ``register`` envelope with its profile (and an optional requested tier) on
   ``devices/<id>/register``, repeated until the server answers ``assign`` (model spec,
   algorithm and options, training settings, run seed);
3. load its data, build the algorithm's device half and the :class:`DeviceAgent` — the same
   agent the in-memory simulation uses — and register again with ``ready`` and its sample count;
4. serve requests (train/evaluate/finish) in order, each acknowledged and de-duplicated by the
   endpoint, until the server broadcasts the end of the run;
5. when the server restarts (a new epoch on its retained status) register again; the half is
   kept when the new assignment is identical, so a resumed run continues with the same state.

Reconnection after broker outages is paho's (the endpoint re-subscribes in ``on_connect``).

The ``data`` string names a dataset and, for demos and benchmarks, a shard of a partition made
exactly as ``edgefl simulate`` makes it (same subsampling, public carve-out and partitioner)::

    NAME[:shard=I/N,partition=iid|dirichlet|shards,alpha=A,k=K,seed=S,min_size=M,
          train_samples=T,test_samples=U,eval_samples=E,public=F,dir=PATH]
"""

from __future__ import annotations

import json
import logging
import queue
import random
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from edgefl.errors import (
    AuthenticationError,
    BrokerUnreachableError,
    ConfigError,
    RunRejectedError,
    TransportError,
    WireError,
)
from edgefl.retry import Backoff, retry
from edgefl.runtime.assignment import Assignment, build_assigned
from edgefl.runtime.dataspec import DataSpec
from edgefl.transport.broker import check_device_id
from edgefl.transport.mqtt import BrokerAddress, MqttDeviceEndpoint
from edgefl.transport.mqtt.connection import check_tls
from edgefl.wire import Envelope, Limits, Payload, decode, encode, new_nonce
from edgefl.wire.validate import Routing, peek

if TYPE_CHECKING:  # torch-backed; imported when a model is built (registration needs no torch)
    from edgefl.runtime.agent import DeviceAgent

log = logging.getLogger(__name__)


from edgefl.runtime.assignment import align_classes  # noqa: E402,F401 (re-exported)

# --- the device process --------------------------------------------------------------------------


@dataclass
class DeviceOptions:
    broker: str
    device_id: str
    data: str
    fleet: str = "default"
    tier: str | None = None  # ask for a tier; the server's policy decides when it is None
    profile: dict[str, Any] | None = None  # None: measure this machine (quick benchmark)
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None  # TLS: the fleet CA, and this device's client certificate and key
    cert_file: str | None = None
    key_file: str | None = None
    delay: float = 0.0  # extra seconds of "local work" per training round (emulates a slow device)
    max_bytes: int = Limits().max_bytes
    register_every: float = 3.0  # first re-registration after this many seconds unanswered,
    register_cap: float = 60.0  # then doubling (±25 % jitter per device) up to this
    exit_when_over: bool = True
    threads: int | None = None
    # where local training runs: auto (CUDA when torch sees it), cpu, cuda, cuda:N
    train_device: str = "auto"
    # write the final model here (safetensors + spec) when the run is over
    save_model: str | None = None
    export: str | None = None  # and export it to this ONNX file, parity-checked on local test data
    wait: float | None = None  # seconds to wait for an unreachable broker (None: forever)
    backoff: Backoff = Backoff(initial=1.0, factor=2.0, cap=30.0)
    say: Callable[[str], None] | None = None  # one line per event (waiting, connected, each round)
    announced: bool = False  # the caller already said which broker it waits for
    extra: dict[str, Any] = field(default_factory=dict)


#: What paho reports when the broker refuses the credentials (MQTT 5 reason codes 0x86, 0x87, 0x8C).
AUTH_REFUSALS = ("Bad user name or password", "Not authorized", "Bad authentication method")


def waiting_line(broker: str, wait: float | None) -> str:
    return (f"waiting for broker {broker} "
            f"({'up to ' + format(wait, 'g') + ' s' if wait is not None else 'no time limit'})")


def wait_for_broker(address: BrokerAddress, *, wait: float | None, backoff: Backoff,
                    say: Callable[[str], None], announce: bool = True,
                    option: str = "--wait") -> None:
    """Return once the broker accepts TCP connections; say so at once and at each retry.
    Raises BrokerUnreachableError after ``wait`` seconds (None: wait forever)."""
    target = f"{address.host}:{address.port}"
    if announce:
        say(waiting_line(str(address), wait))

    def attempt() -> None:
        try:
            with socket.create_connection((address.host, address.port), timeout=5.0):
                pass
        except OSError as e:
            raise BrokerUnreachableError(
                f"broker {target} unreachable: {e.strerror or e}"
            ) from None

    def on_retry(number: int, delay: float, error: BaseException) -> None:
        say(f"{error}; retry {number} in {delay:.1f} s")

    try:
        retry(attempt, retry_on=(BrokerUnreachableError,), backoff=backoff, wait=wait,
              on_retry=on_retry)
    except BrokerUnreachableError as e:
        raise BrokerUnreachableError(f"gave up after {option} {wait:g} s: {e}") from None
    say(f"broker {target} is reachable")
    # a refused certificate or an unverifiable broker: one clear error now, no silent retries
    check_tls(address)


def _kb(n: int) -> str:
    return f"{n / 1024:.1f} kB"


def measure_profile(device_id: str) -> dict[str, Any]:
    from edgefl.profiling import profile_device

    return profile_device(quick=True, name=device_id).to_dict()


class DeviceRuntime:
    def __init__(self, opts: DeviceOptions):
        check_device_id(opts.device_id)
        self.opts = opts
        self.data_spec = DataSpec.parse(opts.data)
        self.limits = Limits(max_bytes=opts.max_bytes)
        address = (
            BrokerAddress.parse(opts.broker)
            .with_credentials(opts.username, opts.password)
            .with_tls(opts.ca_file, opts.cert_file, opts.key_file)
        )
        self.endpoint = MqttDeviceEndpoint(address, opts.fleet, opts.device_id, limits=self.limits)
        self.profile = opts.profile if opts.profile is not None else measure_profile(opts.device_id)
        self.assignment: Assignment | None = None
        self.agent: DeviceAgent | None = None
        self.num_samples = 0
        # this process's registration epoch: its declared size is fixed within it
        self.incarnation = new_nonce()[:16]
        self.server_epoch: str | None = None
        self.registered_epoch: str | None = None  # the epoch whose server accepted us
        self.next_register = 0.0
        self.unanswered = 0  # registrations sent since the server last answered or restarted
        self.register_backoff = Backoff(initial=opts.register_every, factor=2.0,
                                        cap=max(opts.register_cap, opts.register_every))
        self.jitter = random.Random(opts.device_id)  # spreads a fleet's re-registrations apart
        self.held: deque[tuple[Routing, bytes]] = deque()  # requests that came before we were ready
        self.served = 0
        self.over = False
        self.say = opts.say or (lambda line: log.info("device %s: %s", opts.device_id, line))
        # (round, accuracy) of the last evaluation
        self.last_accuracy: tuple[int, float] | None = None

    # -- registration --
    def _register(self) -> None:
        meta: dict[str, Any] = {"profile": json.dumps(self.profile, sort_keys=True),
                                "ready": self.agent is not None,
                                "incarnation": self.incarnation}
        if self.opts.tier:
            meta["tier"] = self.opts.tier
        if self.agent is not None:
            meta["num_samples"] = self.num_samples
        if self.server_epoch:
            meta["epoch"] = self.server_epoch
        env = Envelope("register", 0, self.opts.device_id, fleet=self.opts.fleet,
                       tier=self.opts.tier or "", payload=Payload({}, meta))
        self.endpoint.send("register", encode(env))
        self.next_register = time.monotonic() + self.register_delay(self.unanswered)
        self.unanswered += 1

    def register_delay(self, unanswered: int) -> float:
        """Seconds until the next registration when ``unanswered`` earlier ones went unanswered:
        ``register_every`` doubling up to ``register_cap``, ×0.75–1.25 at random (seeded by the
        device id), so a thousand devices waiting for a busy or absent server neither hammer it
        every few seconds nor all come back in the same instant."""
        return self.register_backoff.delay(unanswered) * self.jitter.uniform(0.75, 1.25)

    def _on_assign(self, data: bytes) -> None:
        env = decode(data, self.limits)
        if env.payload.meta.get("rejected"):
            raise RunRejectedError(
                f"the server refused device {self.opts.device_id}: {env.payload.meta['rejected']}")
        a = Assignment.from_meta(env.payload.meta)
        if self.server_epoch is not None and a.epoch != self.server_epoch:
            log.info("device %s: ignoring an assignment from an earlier server (%s)",
                     self.opts.device_id, a.epoch)
            return
        # the server answers: a ready registration goes out at once, retries start over
        self.unanswered = 0
        if self.agent is None or not a.same_work(self.assignment):
            self._build(a)
            self._register()  # now ready
        self.assignment = a
        if a.accepted and self.registered_epoch != a.epoch:
            self.registered_epoch = a.epoch
            self.agent.run_id = a.epoch  # requests of any other run are answered with an error
            self.say(
                f"registered with server {a.epoch}: {a.spec.name} for {a.algorithm}, {a.rounds} "
                "rounds")
            while self.held:
                self._serve(*self.held.popleft())

    def _build(self, a: Assignment) -> None:
        from edgefl.algorithms.training import resolve_compute
        from edgefl.runtime.agent import DeviceAgent

        compute = resolve_compute(self.opts.train_device)
        half, evals = build_assigned(self.data_spec, a, self.opts.device_id, compute=compute)
        self.agent = DeviceAgent(half, eval_sets=evals, fleet=self.opts.fleet,
                                 algorithm=a.algorithm, limits=self.limits, run_id=a.epoch)
        self.num_samples = len(half.ctx.train_data)
        log.info("device %s: built %s for %s on %d samples, training on %s", self.opts.device_id,
                 a.spec.name, a.algorithm, self.num_samples, compute)

    # -- serving --
    def _serve(self, routing: Routing, data: bytes) -> None:
        if self.agent is None or self.registered_epoch is None:
            self.held.append((routing, data))
            return
        t0 = time.perf_counter()
        if routing.kind == "train" and self.opts.delay > 0:
            time.sleep(self.opts.delay)
        reply = self.agent.handle_bytes(data)
        if reply is not None:
            self.endpoint.reply(routing, reply)
            self._report(routing, data, reply, time.perf_counter() - t0)
        self.served += 1

    def _report(self, request: Routing, down: bytes, up: bytes, seconds: float) -> None:
        """One line per round of local training; evaluations update the accuracy it shows."""
        if self.opts.say is None and not log.isEnabledFor(logging.INFO):
            return  # nobody reads the lines
        try:
            answer = peek(up, self.limits)
        except WireError:
            return
        meta = answer.meta
        # rounds from 1, as the server shows them: a training request carries the index from 0,
        # an evaluation the number of rounds completed before it (the one after round 1 is "r1")
        shown = request.round + 1 if request.kind == "train" else request.round
        if answer.kind == "metrics" and "accuracy" in meta:
            self.last_accuracy = (shown, float(meta["accuracy"]))
        elif answer.kind == "error":
            self.say(f"round {shown}: {request.kind} failed: {meta.get('reason', '?')}")
        elif answer.kind == "update":
            loss = meta.get("train_loss")
            acc = "acc -" if self.last_accuracy is None else ("acc "
                                                              f"{100 * self.last_accuracy[1]:.1f}% "
                                                              f"(eval r{self.last_accuracy[0]})")
            self.say(
                f"round {shown} | tier {answer.tier or '-'} | loss "
                f"{'-' if loss is None else format(float(loss), '.4f')} | "
                f"{acc} | up {_kb(len(up))} | down {_kb(len(down))} | {seconds:.2f} s"
            )

    def _on_server(self, status: dict[str, Any]) -> None:
        epoch = status.get("epoch")
        if (
            status.get("state") == "online"
            and isinstance(epoch, str)
            and epoch != self.server_epoch
        ):
            log.info("device %s: server %s is online; registering", self.opts.device_id, epoch)
            self.server_epoch = epoch
            self.registered_epoch = None
            self.next_register = 0.0
            self.unanswered = 0

    def _on_broadcast(self, routing: Routing) -> None:
        if (
            routing.kind == "finish"
            and routing.meta.get("run_over")
            and self.registered_epoch is not None
            and routing.meta.get("epoch") == self.registered_epoch
        ):
            log.info("device %s: the run is over", self.opts.device_id)
            self.over = True

    def _watch_connection(self, was_connected: bool) -> bool:
        """Say when the broker goes away and comes back; raise when it refuses the credentials."""
        connected = self.endpoint.connected.is_set()
        if not connected and self.endpoint.refused in AUTH_REFUSALS:
            raise AuthenticationError(
                f"the broker at {self.endpoint.address} refused device {self.opts.device_id}: "
                f"{self.endpoint.refused}")
        if connected != was_connected:
            self.say(
                f"connected to broker {self.endpoint.address}"
                if connected
                else f"lost broker {self.endpoint.address}; reconnecting"
            )
        return connected

    def register_if_due(self) -> None:
        if (
            self.registered_epoch is None
            and self.endpoint.connected.is_set()
            and time.monotonic() >= self.next_register
        ):
            self._register()

    def handle(self, kind: str, routing: Routing | None, item: Any) -> None:
        """One item of the endpoint's inbox: the server's status, an assignment, a broadcast or a
        request."""
        try:
            if kind == "server":
                self._on_server(item)
            elif kind == "assign":
                self._on_assign(item)
            elif kind == "broadcast":
                self._on_broadcast(routing)
            elif kind == "request":
                self._serve(routing, item)
        except (WireError, ConfigError) as e:
            log.warning("device %s: rejected a %s message: %s", self.opts.device_id, kind, e)
            if kind == "assign" and isinstance(e, ConfigError):
                raise  # the assigned work cannot be built here: waiting will not change that
        except RunRejectedError:
            raise  # the server said no: the run cannot go on for this device
        except Exception:  # a bug or a hostile message must not end the device: keep serving
            log.exception("device %s: failed on a %s message", self.opts.device_id, kind)

    def run(self, stop_after: float | None = None) -> int:
        """Serve until the run is over (or ``stop_after`` seconds); returns requests served."""
        t_end = None if stop_after is None else time.monotonic() + stop_after
        self.endpoint.start(wait=None)
        connected = False
        try:
            while not (self.over and self.opts.exit_when_over):
                if t_end is not None and time.monotonic() > t_end:
                    break
                connected = self._watch_connection(connected)
                self.register_if_due()
                try:
                    kind, routing, item = self.endpoint.inbox.get(timeout=0.25)
                except queue.Empty:
                    self.endpoint.retry_unacked()
                    continue
                self.handle(kind, routing, item)
                self.endpoint.retry_unacked()
            self._flush()
        finally:
            self.endpoint.stop()
        if self.over and self.agent is not None:
            self._keep_model()
        return self.served

    def _keep_model(self) -> None:
        """The run is over: keep the final model (``--save-model``) and its ONNX file
        (``--export``)."""
        if not (self.opts.save_model or self.opts.export):
            return
        model = self.agent.half.model.cpu()  # the run is over: saved and exported from the CPU
        if self.opts.save_model:
            from edgefl.export.checkpoint import save_model_file

            save_model_file(model, self.opts.save_model, dataset=self.data_spec.dataset)
            self.say(f"saved the final model to {self.opts.save_model}")
        if self.opts.export:
            from edgefl.export.onnx_export import export_model

            test = self.agent.eval_sets.get("test") or self.agent.eval_sets.get("quick")
            parity = test.images(np.arange(min(len(test), 64))) if test is not None else None
            train = self.agent.half.ctx.train_data
            calibration = train.images(np.arange(min(len(train), 256))).cpu()
            names = test.info.class_names if test is not None else None
            report = export_model(model, self.opts.export, class_names=names, parity_images=parity,
                                  calibration_images=calibration)
            self.say(
                f"exported {self.opts.export} (ONNX Runtime vs PyTorch: max |diff| "
                f"{getattr(report, 'max_abs_diff', float('nan')):.2g})")

    def _flush(self, seconds: float = 5.0) -> None:
        """Before leaving, give the last replies a chance to be acknowledged."""
        end = time.monotonic() + seconds
        while self.endpoint.unacked and time.monotonic() < end:
            self.endpoint.retry_unacked()
            time.sleep(0.1)


def run_device(opts: DeviceOptions, stop_after: float | None = None) -> int:
    """Wait for the broker (``opts.wait``), then serve the fleet until the run is over."""
    say = opts.say or (lambda line: log.info("device %s: %s", opts.device_id, line))
    # a bad URL is a configuration error, before waiting; TLS files are checked once the broker
    # answers
    address = (
        BrokerAddress.parse(opts.broker)
        .with_credentials(opts.username, opts.password)
        .with_tls(opts.ca_file, opts.cert_file, opts.key_file)
    )
    check_device_id(opts.device_id)
    DataSpec.parse(opts.data)
    wait_for_broker(address, wait=opts.wait, backoff=opts.backoff, say=say,
                    announce=not opts.announced)
    try:
        import torch
    except ModuleNotFoundError as e:
        from edgefl.errors import missing_extra

        raise (missing_extra(e) or e) from None
    if opts.threads:
        torch.set_num_threads(opts.threads)
    return DeviceRuntime(opts).run(stop_after)


def register_once(
    *,
    broker: str,
    fleet: str,
    device_id: str,
    tier: str | None = None,
    profile: dict[str, Any] | None = None,
    username: str | None = None,
    password: str | None = None,
    timeout: float = 60.0,
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
) -> dict[str, Any]:
    """Register (not ready) and return the server's assignment (the ``assign`` envelope's meta:
    spec, algorithm, rounds, epoch …); the device is not added to a run. Needs no torch."""
    check_device_id(device_id)
    address = (
        BrokerAddress.parse(broker)
        .with_credentials(username, password)
        .with_tls(ca_file, cert_file, key_file)
    )
    endpoint = MqttDeviceEndpoint(address, fleet, device_id,
                                  client_id=f"edgefl-{fleet}-{device_id}-register", will=False)
    profile = profile if profile is not None else measure_profile(device_id)
    meta: dict[str, Any] = {"profile": json.dumps(profile, sort_keys=True), "ready": False}
    if tier:
        meta["tier"] = tier
    end = time.monotonic() + timeout
    endpoint.start(wait=min(timeout, 30.0))
    try:
        next_send = 0.0
        while time.monotonic() < end:
            if time.monotonic() >= next_send:
                env = Envelope("register", 0, device_id, fleet=fleet, tier=tier or "",
                               payload=Payload({}, meta))
                endpoint.send("register", encode(env))
                next_send = time.monotonic() + 3.0
            try:
                kind, _, item = endpoint.inbox.get(timeout=0.25)
            except queue.Empty:
                continue
            if kind == "assign":
                meta = decode(item).payload.meta
                if meta.get("rejected"):
                    raise RunRejectedError(
                        f"the server refused device {device_id}: {meta['rejected']}")
                return meta
    finally:
        endpoint.stop()
    raise TransportError(
        f"no server of fleet {fleet!r} answered {device_id}'s registration within {timeout:g} s")
