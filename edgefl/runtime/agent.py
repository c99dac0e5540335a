"""The device agent: turns server envelopes into calls on a device half, and replies.

The same agent serves the in-memory simulation and a real device over MQTT.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping, MutableMapping
from contextlib import contextmanager

import torch

from edgefl.algorithms.base import DeviceHalf
from edgefl.algorithms.training import evaluate
from edgefl.data import ArrayDataset
from edgefl.errors import WireError
from edgefl.runtime.loop import UNCHANGED
from edgefl.wire import Envelope, Limits, Payload, decode, encode

log = logging.getLogger(__name__)


def model_fingerprint(model: torch.nn.Module) -> str:
    """Digest of a model's state: devices holding identical models are evaluated once."""
    h = hashlib.sha1()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


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
    def __init__(
        self,
        half: DeviceHalf,
        *,
        eval_sets: Mapping[str, ArrayDataset] | None = None,
        fleet: str = "default",
        algorithm: str = "",
        limits: Limits = Limits(),
        eval_cache: MutableMapping[tuple[str, str], dict[str, float]] | None = None,
    ):
        self.half = half
        self.eval_sets = dict(eval_sets or {})
        self.fleet, self.algorithm, self.limits = fleet, algorithm, limits
        self.eval_cache = eval_cache
        self.absorbed_eval_round: int | None = None  # the evaluation downlink absorbed last, if nothing since

    @property
    def device_id(self) -> str:
        return self.half.ctx.device_id

    def handle_bytes(self, data: bytes) -> bytes:
        try:
            env = decode(data, self.limits)
        except WireError as e:
            log.warning("device %s rejected a message: %s", self.device_id, e)
            return encode(self._reply("error", -1, Payload({}, {"reason": f"rejected: {e}"})))
        return encode(self.handle(env))

    def handle(self, env: Envelope) -> Envelope:
        try:
            if env.kind == "train":
                since = env.payload.meta.get(UNCHANGED)
                if since is None:
                    self.half.receive(env.round, env.payload)
                elif since != self.absorbed_eval_round:  # e.g. this process restarted meanwhile
                    raise WireError(f"the server relies on round {since}'s evaluation downlink, which this device does not hold")
                self.absorbed_eval_round = None
                t0 = time.perf_counter()
                with seeded_torch(self.half.ctx, env.round):
                    up = self.half.fit(env.round)
                up.meta["train_seconds"] = time.perf_counter() - t0
                return self._reply("update", env.round, up)
            if env.kind == "evaluate":
                if env.payload.arrays or set(env.payload.meta) - {"split"}:
                    self.half.receive(env.round, env.payload)
                self.absorbed_eval_round = env.round
                split = str(env.payload.meta.get("split", "test"))
                return self._reply("metrics", env.round, Payload({}, self.evaluate(split)))
            if env.kind == "finish":
                self.absorbed_eval_round = None
                with seeded_torch(self.half.ctx, env.round):
                    self.half.finish(env.round, env.payload)
                return self._reply("done", env.round)
            raise WireError(f"a device does not handle {env.kind!r} messages")
        except Exception as e:
            log.exception("device %s failed on %s for round %d", self.device_id, env.kind, env.round)
            return self._reply("error", env.round, Payload({}, {"reason": f"{type(e).__name__}: {e}"}))

    def evaluate(self, split: str) -> dict[str, float]:
        data = self.eval_sets.get(split)
        if data is None:
            raise WireError(f"device {self.device_id} has no {split!r} data to evaluate on")
        key = (model_fingerprint(self.half.model), split) if self.eval_cache is not None else None
        if key is not None and key in self.eval_cache:
            return dict(self.eval_cache[key])
        metrics = evaluate(self.half.model, data)
        if key is not None:
            self.eval_cache[key] = dict(metrics)
        return metrics

    def _reply(self, kind: str, round: int, payload: Payload | None = None) -> Envelope:
        return Envelope(
            kind=kind,
            round=round,
            device_id=self.device_id,
            fleet=self.fleet,
            algorithm=self.algorithm,
            tier=self.half.ctx.spec.tier,
            payload=payload or Payload(),
        )
