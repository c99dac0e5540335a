"""The device agent: turns server envelopes into calls on a device half, and replies.

The same agent serves the in-memory simulation and a real device over MQTT.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Mapping, MutableMapping
from contextlib import contextmanager, nullcontext

import numpy as np
import torch

from edgefl.algorithms.base import DeviceHalf
from edgefl.algorithms.training import evaluate
from edgefl.data import ArrayDataset
from edgefl.errors import WireError
from edgefl.runtime.exchange import MAX_SAMPLES, MODEL_PREFIX, SEND_MODEL, UNCHANGED
from edgefl.wire import REPLY_KINDS, Envelope, Limits, Payload, decode, encode
from edgefl.wire.schema import MAX_ABS_METRIC, check_arrays
from edgefl.wire.tensors import state_to_arrays
from edgefl.wire.validate import peek

log = logging.getLogger(__name__)


def model_fingerprint(model: torch.nn.Module) -> str:
    """Digest of a model's state: devices holding identical models are evaluated once."""
    h = hashlib.sha1()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()



def _modules(half: object) -> list[torch.nn.Module]:
    """Every module a device half keeps (its model, a method's other networks), through the
    wrappers that hold the method's half as ``inner`` (local DP, DP-SGD, secure aggregation)."""
    found: list[torch.nn.Module] = []
    while half is not None:
        found += [m for m in vars(half).values() if isinstance(m, torch.nn.Module)]
        half = vars(half).get("inner")
    return found


@contextmanager
def undone_on_failure(half: object):
    """A round's local work that fails (it raises, or :func:`_check_finite` refuses what it would
    send) leaves the half's networks as they were before the round: a device whose training
    diverged once trains the next round, answers evaluations and exports from its last finite
    weights instead of carrying non-finite ones to the end of the run. Optimizers are made afresh
    each round (``edgefl.algorithms.training.make_optimizer``), so the weights and buffers are what
    a round changes and persists."""
    saved = [(m, {k: t.detach().clone() for k, t in m.state_dict().items()})
             for m in _modules(half)]
    try:
        yield
    except Exception:
        for module, state in saved:
            module.load_state_dict(state)
        raise

#: Mixed into the seed of torch's generator during local work (apart from the ctx.rng streams).
TORCH_STREAM = 1_000


@contextmanager
def seeded_torch(ctx, round: int):
    """Local work under torch's global CPU generator seeded per (device, round), restored after:
    whatever draws from it (dropout masks, randomly initialised heads) is then the same in any
    process and in any order of devices, so a run over MQTT repeats the in-memory run.

    Local training runs on the CPU. ``torch.manual_seed`` and ``torch.random.fork_rng`` would
    also reach for CUDA (~80–450 µs a call on a CUDA build, which showed in the per-round
    overhead); the CPU generator alone costs ~2 µs. Python hashes tuples of ints the same in
    every process (only str/bytes hashing is randomised)."""
    generator = torch.default_generator
    state = generator.get_state()
    generator.manual_seed(hash((ctx.seed, round, TORCH_STREAM)) & (2**63 - 1))
    try:
        yield
    finally:
        generator.set_state(state)


class DeviceAgent:
    """Serves one device half. Every request gets an answer: the reply, or an ``error`` reply
    saying why not (a downlink that fails its checks, another run or algorithm, a failure or a
    non-finite result of local work, an out-of-memory), so the server never waits out a
    deadline for a device that is alive. Only a message that is no request at all (unreadable
    routing) goes unanswered: there is nobody to answer."""

    def __init__(
        self,
        half: DeviceHalf,
        *,
        eval_sets: Mapping[str, ArrayDataset] | None = None,
        fleet: str = "default",
        algorithm: str = "",
        limits: Limits = Limits(),
        eval_cache: MutableMapping[tuple[str, str], dict[str, float]] | None = None,
        run_id: str | None = None,
    ):
        self.half = half
        self.eval_sets = dict(eval_sets or {})
        self.fleet, self.algorithm, self.limits = fleet, algorithm, limits
        self.eval_cache = eval_cache
        # the evaluation downlink absorbed last, if nothing since
        self.absorbed_eval_round: int | None = None
        #: the server run this device serves (set at registration); None: the first request's
        self.run_id = run_id

    @property
    def device_id(self) -> str:
        return self.half.ctx.device_id

    def handle_bytes(self, data: bytes) -> bytes | None:
        try:
            env = decode(data, self.limits)
        except WireError as e:
            log.warning("device %s rejected a message: %s", self.device_id, e)
            try:  # answer the request it claims to be, if its routing is readable
                r = peek(data, self.limits)
            except WireError:
                return None
            if r.kind not in REPLY_KINDS:
                return None
            request = Envelope(r.kind, r.round, r.device_id, r.fleet, r.algorithm, r.tier,
                               run=r.run, nonce=r.nonce)
            return self._encode(self._error(request, f"rejected: {e}"))
        return self._encode(self.handle(env))

    def _encode(self, reply: Envelope) -> bytes:
        try:
            return encode(reply)
        except WireError as e:  # e.g. a non-finite value in the result: say so instead
            log.warning("device %s cannot send its %s: %s", self.device_id, reply.kind, e)
            return encode(self._error(reply, f"cannot send the {reply.kind}: {e}"))

    def _error(self, request: Envelope, reason: str) -> Envelope:
        return request.reply("error", Payload({}, {"reason": reason[:4000]}),
                             algorithm=self.algorithm)

    def _check_request(self, env: Envelope) -> None:
        if env.device_id != self.device_id or env.fleet != self.fleet:
            raise WireError(f"a request for {env.device_id!r} in fleet {env.fleet!r}")
        if env.kind not in REPLY_KINDS:
            raise WireError(f"a device does not handle {env.kind!r} messages")
        if env.algorithm != self.algorithm:
            raise WireError(
                f"a request for algorithm {env.algorithm!r}; this device runs {self.algorithm!r}")
        if self.run_id is not None and env.run != self.run_id:
            raise WireError(f"a request of run {env.run!r}; this device serves run {self.run_id!r}")
        if env.payload.arrays:
            check_arrays(env.payload.arrays, self.half.expected_downlink(), "downlink")

    def handle(self, env: Envelope) -> Envelope:
        try:
            self._check_request(env)
            if env.kind == "train":
                since = env.payload.meta.get(UNCHANGED)
                if since is None:
                    self.half.receive(env.round, env.payload)
                elif since != self.absorbed_eval_round:  # e.g. this process restarted meanwhile
                    raise WireError(
                        f"the server relies on round {since}'s evaluation downlink, which this "
                        "device does not hold")
                self.absorbed_eval_round = None
                t0 = time.perf_counter()
                undo = undone_on_failure if self.half.undo_failed_rounds else nullcontext
                with undo(self.half):
                    with seeded_torch(self.half.ctx, env.round):
                        up = self.half.fit(env.round)
                    up.meta["train_seconds"] = time.perf_counter() - t0
                    _check_finite(up)
                return env.reply("update", up, algorithm=self.algorithm)
            if env.kind == "evaluate":
                meta = dict(env.payload.meta)
                split = str(meta.pop("split", "test"))
                limit = meta.pop(MAX_SAMPLES, None)
                if env.payload.arrays or meta:
                    self.half.receive(env.round, Payload(env.payload.arrays, meta))
                self.absorbed_eval_round = env.round
                return env.reply("metrics", Payload({}, self.evaluate(split, limit)),
                                 algorithm=self.algorithm)
            self.absorbed_eval_round = None
            meta = dict(env.payload.meta)
            send_model = bool(meta.pop(SEND_MODEL, False))
            with seeded_torch(self.half.ctx, env.round):
                self.half.finish(env.round, Payload(env.payload.arrays, meta))
            # asked for: the final model goes back with the reply (checked by the server against its
            # spec), unless local differential privacy protects this device's data: then no model
            # leaves it un-noised (the device keeps it: edgefl train --save-model/--export)
            send_model = send_model and self.half.sends_final_model
            up = Payload(
                state_to_arrays(self.half.model.state_dict(), MODEL_PREFIX) if send_model else {},
                {})
            return env.reply("done", up, algorithm=self.algorithm)
        # MemoryError and torch's OutOfMemoryError included: answer, keep serving
        except Exception as e:
            log.exception("device %s failed on %s for round %d", self.device_id, env.kind,
                          env.round)
            return self._error(env, f"{type(e).__name__}: {e}")

    def evaluate(self, split: str, limit: int | None = None) -> dict[str, float]:
        """Accuracy (and loss) on the ``split`` evaluation set, on its first ``limit`` samples if
        given."""
        data = self.eval_sets.get(split)
        if data is None:
            raise WireError(f"device {self.device_id} has no {split!r} data to evaluate on")
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise WireError(f"{MAX_SAMPLES} must be a positive integer, got {limit!r}")
            if limit < len(data):
                data = data.subset(np.arange(limit))
        key = (
            (model_fingerprint(self.half.model), split, limit)
            if self.eval_cache is not None
            else None
        )
        if key is not None and key in self.eval_cache:
            return dict(self.eval_cache[key])
        metrics = evaluate(self.half.model, data)
        if not math.isfinite(metrics["loss"]) or metrics["loss"] > MAX_ABS_METRIC:
            # a diverged model still has an accuracy to report; its loss does not fit on the wire
            del metrics["loss"]
            metrics["loss_diverged"] = True
        if key is not None:
            self.eval_cache[key] = dict(metrics)
        return metrics


def _check_finite(up: Payload) -> None:
    """Local work that diverged is an error to report, not an update to send: non-finite
    values, or a number in its metadata beyond what the server accepts (a training loss of 1e32:
    ``MAX_ABS_METRIC``), which the server would refuse anyway."""
    for key, value in up.meta.items():
        if isinstance(value, float) and not (math.isfinite(value)
                                             and abs(value) <= MAX_ABS_METRIC):
            raise FloatingPointError(f"local work produced {key} = {value}, not a finite "
                                     f"number within ±{MAX_ABS_METRIC:g}")
    for name, a in up.arrays.items():
        if np.asarray(a).dtype.kind == "f" and not np.isfinite(a).all():
            raise FloatingPointError(f"local work produced non-finite values in {name!r}")
