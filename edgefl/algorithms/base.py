"""The algorithm interface: one module per method, both halves in it, registered by name.

A method is an :class:`Algorithm` entry naming a :class:`DeviceHalf` and a :class:`ServerHalf`.

Device half (one object per device, owns the device's model):
    ``receive(round, payload)``  absorb what the server sent (weights, statistics, kernels …).
                                 Idempotent while the server state is unchanged: the runtime may
                                 call it again before an evaluation.
    ``fit(round) -> Payload``     local work; returns the uplink.
    ``expected_downlink()``       ``{array name: ArraySpec}`` of a non-empty downlink (arrays of a
                                 group may be absent together); the agent refuses any other.
    ``finish(round, payload)``    the end of the run: default = ``receive`` (install the final
                                 model); methods with a last local phase (FedVTC's fine-tuning)
                                 override it.

Server half (one object per run):
    ``select(round, device_ids, rng)``       which devices work this round (default: a fraction,
                                             at least ``ctx.min_fit``).
    ``downlink(round, device_id) -> Payload`` what a device gets (per device: sub-models, tiers).
    ``aggregate(round, uplinks) -> metrics``  fold the round's uplinks into the server state. Only
                                             the uplinks that arrived are passed; a missing device
                                             is never an error here.
    ``state_dict()/load_state_dict()``       arrays only, so checkpoints need no pickle.
    ``server_opt``                           the run's server optimizer: a method that averages
                                             weights passes the average through
                                             ``server_opt.step`` and keeps its state in its own
                                             checkpoint (declared as ``averages_weights``).
    ``expected_uplink(device_id)``           ``{array name: ArraySpec(dtype, shape)}``: every array
                                             an update of that device carries, checked before
                                             aggregate (edgefl.wire.validate.check_reply); an
                                             undeclared array is refused; None = no check.

What a method needs from the run (server-held data and its share, an alignment pool that devices
also hold, closing rounds after training) it declares once, as :class:`MethodNeeds` on its
:class:`Algorithm` entry; the run assembly (:mod:`edgefl.runtime.setup`) reads the declaration and
never asks a method about itself by name. The round being run is ``ServerContext.round``, kept
by the round loop: a method keeps no round counter of its own.

Payloads are dicts of numpy arrays plus scalar metadata (:class:`edgefl.wire.Payload`); the same
objects run in the in-memory simulation and over MQTT. Algorithms never import a transport.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from pydantic import ConfigDict, TypeAdapter, ValidationError
from torch import nn

from edgefl.algorithms.server_opt import ServerOptimizer, ServerOptSettings
from edgefl.data import ArrayDataset
from edgefl.errors import ConfigError, UnknownNameError
from edgefl.models import ModelSpec, build_model
from edgefl.privacy import Release
from edgefl.wire import ArraySpec, Payload, spec_of, state_to_arrays


@dataclass(frozen=True)
class TrainSettings:
    """Local-training hyperparameters shared by every method."""

    epochs: int = 1
    steps: int | None = None  # if set: this many minibatch steps per round instead of epochs
    batch_size: int = 32
    optimizer: str = "sgd"  # sgd | adam
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 0.0
    lr_decay_rounds: tuple[int, ...] = ()  # multiply lr by lr_gamma at each of these rounds
    lr_gamma: float = 0.1
    # the L2 norm the whole gradient of a step is scaled down to before the optimizer's step
    # (torch.nn.utils.clip_grad_norm_); None: not clipped
    max_grad_norm: float | None = None

    def visits(self, num_samples: int) -> int:
        """How many sample visits one round of local training makes on ``num_samples`` samples."""
        return self.steps * self.batch_size if self.steps else self.epochs * num_samples

    def lr_scale(self, round: int) -> float:
        """The schedule's factor at ``round``: lr_gamma to the number of decays passed."""
        return self.lr_gamma ** sum(round >= r for r in self.lr_decay_rounds)

    def lr_at(self, round: int) -> float:
        return self.lr * self.lr_scale(round)


@dataclass
class DeviceContext:
    """What a device half is given: its identity, model spec, private data and settings."""

    device_id: str
    spec: ModelSpec
    train_data: ArrayDataset
    settings: TrainSettings
    seed: int  # this device's seed (derived from the run seed and the device id)
    rounds: int  # training rounds of the run (for schedules such as FedHeNN's η_t)
    public: ArrayDataset | None = None  # the server's pool, when the method's needs say that
    # devices hold it too (FedHeNN's rad_source=device)
    compute: str = "cpu"  # the torch device that trains ("cpu", "cuda", "cuda:1"): the model
    # lives there and the data's batches are made there; payloads are numpy (CPU) either way

    @property
    def num_classes(self) -> int:
        return self.spec.num_classes

    def rng(self, round: int, stream: int = 0) -> np.random.Generator:
        """Reproducible per (device, round): the same on any transport and in any order."""
        return np.random.default_rng([self.seed, round, stream])


@dataclass
class DeviceRecord:
    """The server's view of one device."""

    spec: ModelSpec
    num_samples: int = 0
    profile: dict[str, Any] = field(default_factory=dict)


def total_rounds(rounds: int, closing_rounds: int) -> int:
    """A run's exchanges: its ``rounds`` training rounds and the ``closing_rounds`` its method
    declares after them (rounds ``rounds .. rounds + closing_rounds - 1``). Computed here only."""
    return rounds + closing_rounds


@dataclass
class ServerContext:
    """What a server half is given. ``fleet`` is live: devices may join during a run."""

    num_classes: int
    fleet: dict[str, DeviceRecord]
    settings: TrainSettings
    rounds: int
    seed: int
    fraction: float = 1.0
    min_fit: int = 1  # the fewest devices a round trains (when that many are in the fleet)
    # server-held data (HierarchyFL's labelled 1%, FedHeNN's pool)
    public: ArrayDataset | None = None
    closing_rounds: int = 0  # rounds after training (the method's declared needs)
    #: uplink arrays that are model changes (the method's declared ``uplink_deltas``)
    uplink_deltas: tuple[str, ...] = ()
    #: The server optimizer that turns averaged weights into the new ones (``--server-opt``); only
    #: methods that declare ``averages_weights`` are given another than plain averaging.
    server_opt: ServerOptSettings = field(default_factory=ServerOptSettings)
    #: The round in progress (or the closing exchange's round), set by the round loop before it
    #: selects devices: round state lives here, not on the method object.
    round: int = 0

    def specs(self) -> list[ModelSpec]:
        """The distinct model specs of the fleet, in first-seen order."""
        return list(dict.fromkeys(r.spec for r in self.fleet.values()))

    def single_spec(self, method: str) -> ModelSpec:
        specs = self.specs()
        if len(specs) != 1:
            names = ", ".join(s.name for s in specs)
            raise ConfigError(
                f"{method} trains one global model, but the fleet has {len(specs)} architectures "
                f"({names}); give one tier"
            )
        return specs[0]

    def rng(self, round: int, stream: int = 0) -> np.random.Generator:
        return np.random.default_rng([self.seed, round, 10_000 + stream])

    @property
    def total_rounds(self) -> int:
        """The rounds the run exchanges in all: training rounds, then the closing rounds."""
        return total_rounds(self.rounds, self.closing_rounds)


@contextlib.contextmanager
def cpu_seeded(seed: int):
    """torch's CPU generator seeded with ``seed`` inside, restored after: what
    ``torch.random.fork_rng()`` with ``torch.manual_seed(seed)`` does for CPU work, without their
    reach for the accelerators (on a CUDA build each counts the GPUs and records a traceback for
    their lazy seeding: ~5 ms a device built, most of a small device's start)."""
    generator = torch.default_generator
    state = generator.get_state()
    generator.manual_seed(seed)
    try:
        yield
    finally:
        generator.set_state(state)


class DeviceHalf:
    """Base of every device half; subclasses implement :meth:`fit`."""

    #: the final model goes back to the server when it asks (False where local differential
    #: privacy keeps it on the device: edgefl.privacy.seam.PrivateDevice)
    sends_final_model = True
    #: DP-SGD (``dp=sgd``, edgefl.privacy.dpsgd) can train this half: each round it trains its
    #: model on its own data in one call of ``train_local`` whose loss is the mean of per-sample
    #: losses (or a PenalizedLoss: plus a term of the weights and public values alone), and it
    #: uses its data nowhere else, so what it sends is computed from DP-SGD's weights
    dp_sgd_ready = False
    #: the device agent copies this half's networks before each round's local work and puts them
    #: back if it fails (edgefl.runtime.agent.undone_on_failure); a half whose ``fit`` changes no
    #: network (the overhead benchmark's echo) sets False and saves the copy
    undo_failed_rounds = True

    def __init__(self, ctx: DeviceContext, options: Any):
        #: the training device: the model, the data's batches and every tensor a half keeps for
        #: its loss live there (a half makes its own with ``device=self.device``)
        self.device = torch.device(ctx.compute)
        if self.device.type != "cpu":
            public = ctx.public.on(self.device) if ctx.public is not None else None
            ctx = dataclasses.replace(ctx, train_data=ctx.train_data.on(self.device), public=public)
        self.ctx = ctx
        self.options = options
        with cpu_seeded(ctx.seed):
            # built on the CPU (the same initial weights on any device), then moved
            self.model: nn.Module = build_model(ctx.spec).to(self.device)

    def receive(self, round: int, payload: Payload) -> None:  # noqa: B027 - optional hook
        """Absorb the server's downlink. Default: nothing (purely local methods)."""

    def fit(self, round: int) -> Payload:
        raise NotImplementedError

    def expected_downlink(self) -> Mapping[str, ArraySpec] | None:
        """The arrays (name → dtype and shape) a downlink that carries any carries, checked by
        the device agent before :meth:`receive`: an array of a group (``ArraySpec.group``) may be
        absent with its whole group, an undeclared array is refused. ``{}``: downlinks carry no
        arrays. None (the default): no check beyond the codec's."""
        return None

    def weight_specs(self, prefix: str) -> dict[str, ArraySpec]:
        """This model's state as it travels under ``prefix`` (:func:`edgefl.wire.state_to_arrays`):
        the declaration of a downlink that carries weights for this model."""
        cache = self.__dict__.setdefault("_weight_specs", {})
        if prefix not in cache:
            cache[prefix] = {
                k: spec_of(v) for k, v in state_to_arrays(self.model.state_dict(), prefix).items()
            }
        return cache[prefix]

    def finish(self, round: int, payload: Payload) -> None:
        self.receive(round, payload)

    @classmethod
    def privacy_release(cls, options: Any) -> Release | None:
        """What this half's uplink reveals (:class:`edgefl.privacy.Release`): which arrays are
        weights clipped as a whole and which are per-class statistics of its samples. None (the
        default): undeclared, and differential privacy refuses the method."""
        return None

    def sample_vectors(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each sample's row of every per-class statistic the uplink carries ({block: [B, d]},
        the blocks of ``privacy_release(options).stats``), computed in eval mode."""
        raise NotImplementedError(f"{type(self).__name__} sends no per-class statistics")


class ServerHalf:
    """Base of every server half.

    ``count_arrays``: the uplink arrays that are per-class counts a device claims (knowledge methods
    weigh classes by them), each with its unit: ``"samples"`` (each sample counted once) or
    ``"visits"`` (each time local training saw a sample: :meth:`TrainSettings.visits`). The round
    loop clips each, like ``num_samples``, to the weight bound in that unit before :meth:`aggregate`
    sees them (:mod:`edgefl.runtime.claims`)."""

    count_arrays: Mapping[str, str] = {}
    #: Secure aggregation's settings where the half is wrapped by its server
    #: (:class:`edgefl.privacy.secagg_halves.SecAggServer`, whose stages carry the downlink).
    secagg: Any = None

    def __init__(self, ctx: ServerContext, options: Any):
        self.ctx = ctx
        self.options = options
        #: the one server step of a method that averages weights
        #: (:mod:`edgefl.algorithms.server_opt`); its state belongs in the method's ``state_dict``
        self.server_opt = ServerOptimizer(ctx.server_opt)

    def select(self, round: int, device_ids: Sequence[str], rng: np.random.Generator) -> list[str]:
        ids = sorted(device_ids)
        if not ids:
            return []
        k = min(
            len(ids), max(self.ctx.min_fit, int(math.ceil(self.ctx.fraction * len(ids) - 1e-9)))
        )
        if k == len(ids):  # every device: what the draw below gives, sorted, without drawing
            return ids
        return sorted(rng.choice(ids, size=k, replace=False).tolist())

    def downlink(self, round: int, device_id: str) -> Payload:
        return Payload()

    def aggregate(self, round: int, uplinks: Mapping[str, Payload]) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, np.ndarray]:
        return {}

    def load_state_dict(self, arrays: Mapping[str, np.ndarray]) -> None:  # noqa: B027
        pass

    def round_report(self) -> dict[str, Any]:
        """Entries the round loop adds to each round's record (the privacy ledger's ``privacy``)."""
        return {}

    def all_failed_hint(self, failed: Mapping[str, str]) -> str:
        """The likely cause when every device of a round failed (``failed``: device → why), where
        the server can tell (central DP's noise: :class:`edgefl.privacy.seam.PrivateServer`); the
        round loop adds it to the run's ending message. Empty: nothing to add."""
        return ""

    def expected_uplink(self, device_id: str) -> Mapping[str, ArraySpec] | None:
        """The arrays (name → dtype and shape; a None axis = any length) an uplink of
        ``device_id`` carries, all of them: an array not named here is refused.

        None (the default) means no check beyond the envelope codec's.
        """
        return None


@dataclass(frozen=True)
class NoOptions:
    """For methods without options of their own."""


@dataclass(frozen=True)
class MethodNeeds:
    """What a method needs from the run beyond its devices' private data: its one declaration,
    read by the run assembly (:mod:`edgefl.runtime.setup`) and the round loop.

    Messages (the keys, dtypes and shapes of uplinks and downlinks) are declared apart, on the
    server half (``expected_uplink``), because they depend on the fleet.
    """

    #: Share of the training set carved out (stratified, before partitioning) and held by the
    #: server: HierarchyFL's labelled 1 %, FedHeNN's alignment pool. 0 = none. A run's
    #: ``public_fraction`` setting overrides it.
    public_share: float = 0.0
    #: What the server-held share is for: "labelled" (trained on, with its labels) or
    #: "alignment" (only its images are used, to compare representations).
    public_use: Literal["labelled", "alignment"] = "labelled"
    #: Whether every device holds the server's pool too (FedHeNN rad_source=device): device
    #: processes then carve it out of their dataset exactly as the server does.
    devices_hold_public: bool = False
    #: Rounds after the training rounds (FedVTC's one-shot decoder upload); the loop runs them
    #: as rounds ``rounds .. rounds + closing_rounds - 1`` with ``phase = "closing"``.
    closing_rounds: int = 0
    #: Whether the server averages model weights (over the fleet, a tier's sub-models or an
    #: architecture) and hands the average to its ``server_opt`` step: only then may a run choose
    #: a server optimizer other than plain averaging (``--server-opt``).
    averages_weights: bool = False
    #: Whether the method can run asynchronously (``--aggregation async``, FedBuff): the server
    #: folds whatever arrives whenever it arrives, and an uplink's weights are the downlink's
    #: arrays updated (same names), which the round loop rebases onto the newest model, or
    #: changes of them (``uplink_deltas``), which it scales by the staleness weight.
    asynchronous: bool = False
    #: Name prefixes of the uplink arrays that are changes of the model the downlink gave
    #: (HeteroFL's and HierarchyFL's ``d/``): scaled by s(τ) in an asynchronous run.
    uplink_deltas: tuple[str, ...] = ()

    def __post_init__(self):
        if not 0 <= self.public_share < 1:
            raise ValueError(f"public_share must be in [0, 1) (got {self.public_share})")
        if self.closing_rounds < 0:
            raise ValueError(f"closing_rounds must be >= 0 (got {self.closing_rounds})")
        if self.devices_hold_public and self.public_share <= 0:
            raise ValueError("devices_hold_public needs a public_share > 0")


@dataclass(frozen=True)
class Algorithm:
    """A registry entry: the two halves, typed options and the paper's default run settings."""

    name: str
    description: str
    device: type[DeviceHalf]
    server: type[ServerHalf]
    options: type = NoOptions
    #: Run-config defaults that match the paper (model family, tiers, optimizer, lr, …); the
    #: user's explicit options override them.
    defaults: Mapping[str, Any] = field(default_factory=dict)
    #: What the method needs from the run: a :class:`MethodNeeds`, or a function of the parsed
    #: options returning one when the needs depend on them (FedHeNN's rad_source).
    needs: MethodNeeds | Callable[[Any], MethodNeeds] = MethodNeeds()

    def parse_options(self, raw: Mapping[str, Any]) -> Any:
        return parse_options(self.options, raw, self.name)

    def needs_for(self, options: Any) -> MethodNeeds:
        """The declaration for these (parsed) options."""
        needs = self.needs(options) if callable(self.needs) else self.needs
        if not isinstance(needs, MethodNeeds):
            raise TypeError(
                f"{self.name}: needs must give a MethodNeeds, got {type(needs).__name__}"
            )
        return needs


_REGISTRY: dict[str, Algorithm] = {}


def register(algorithm: Algorithm) -> Algorithm:
    if algorithm.name in _REGISTRY:
        raise ValueError(f"algorithm {algorithm.name!r} is already registered")
    _REGISTRY[algorithm.name] = algorithm
    return algorithm


def get_algorithm(name: str) -> Algorithm:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownNameError("algorithm", name, algorithm_names()) from None


def algorithm_names() -> list[str]:
    return sorted(_REGISTRY)


#: Options given as text (``-o key=value``) or TOML: numbers are accepted where text is declared.
_OPTION_INPUT = ConfigDict(coerce_numbers_to_str=True)


@functools.cache
def _validator(typ: Any) -> TypeAdapter:
    return TypeAdapter(typ, config=_OPTION_INPUT)


def _option_value(value: Any, typ: Any, key: str, method: str) -> Any:
    """One option's value, validated by pydantic against its declared type; from text, ``none``
    is None (an optional option), ``a,b`` a tuple, and ``yes``/``no``/``1``/``0`` a flag."""
    args = typing.get_args(typ)
    optional = type(None) in args
    base = next(a for a in args if a is not type(None)) if optional else typ
    if isinstance(value, str) and optional and value.strip().lower() == "none":
        return None
    given = value
    if isinstance(value, str) and typing.get_origin(base) is tuple:
        value = [v for v in value.split(",") if v.strip()]
    try:
        return _validator(typ).validate_python(value)
    except ValidationError:
        value = given
    if typing.get_origin(base) is Literal:
        raise ConfigError(
            f"{method} option {key}={value!r}: choose one of "
            f"{', '.join(map(str, typing.get_args(base)))}"
        )
    if typing.get_origin(base) is tuple:
        inner = typing.get_args(base)[0]
        raise ConfigError(
            f"{method} option {key}={value!r} is not a valid comma-separated list of "
            f"{inner.__name__}"
        )
    raise ConfigError(
        f"{method} option {key}={value!r} is not a valid {getattr(base, '__name__', base)}"
    )


def parse_options(cls: type, raw: Mapping[str, Any], method: str) -> Any:
    """Build an options dataclass from strings (CLI ``-o key=value``) or typed values."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        valid = ", ".join(sorted(fields)) or "(none)"
        raise ConfigError(f"{method} has no option {', '.join(unknown)}; its options are: {valid}")
    hints = typing.get_type_hints(cls)
    values = {k: _option_value(v, hints[k], k, method) for k, v in raw.items()}
    try:
        return cls(**values)
    except ValueError as e:
        raise ConfigError(f"{method}: {e}") from None
