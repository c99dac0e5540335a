"""An in-memory simulation on a Ray cluster: ``edgefl simulate --backend ray [--ray-address ADDR]``.

The server and the round loop stay in this process (Ray's driver). The devices live in Ray actors,
``workers`` of them, each holding a :class:`~edgefl.runtime.parallel.DeviceGroup` (devices
``ids[k::workers]``, built by the same run assembly as every other backend), so for a seed the
results are those of the sequential and the worker-process runs at the same threads per device.
Actors are placed by Ray, on any node of the cluster: each node needs edgefl and the dataset
(the same ``--data-dir``). Envelopes travel as their bytes and are decoded and checked by the round
loop as over MQTT; the final models come back to the driver as safetensors bytes.

A Ray cluster is trusted by design (Ray runs the driver's code on every node, and its own
serialization of task arguments and results is pickle-based), so run it on machines you control,
never with devices of the fleet. Without ``address`` a local Ray is started for the run and
stopped after it; with one, the run joins that cluster and leaves it running.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from edgefl.config import RunConfig
from edgefl.errors import ConfigError, EdgeflError, install_hint
from edgefl.transport.base import Accept, Delivery, answered

log = logging.getLogger(__name__)


def _ray():
    try:
        import ray
    except ImportError:
        raise ConfigError(f"--backend ray needs Ray: {install_hint('ray')}") from None
    return ray


class RayPool:
    """A wire transport over ``workers`` Ray actors holding ``ids``' devices (one CPU each)."""

    def __init__(self, cfg: RunConfig, ids: Sequence[str], workers: int, *,
                 address: str | None = None,
                 threads: int = 1, costs: Mapping[str, float] | None = None):
        ray = _ray()
        from edgefl.runtime.parallel import DeviceGroup, device_groups

        if workers < 1:
            raise EdgeflError(f"workers must be >= 1 (got {workers})")
        groups = device_groups(ids, workers, costs)
        workers = len(groups)
        self._started = not ray.is_initialized()
        if self._started:
            kwargs = (
                {"address": address}
                if address
                else {"num_cpus": workers, "include_dashboard": False}
            )
            ray.init(**kwargs, log_to_driver=False, configure_logging=False)
        self.threads = threads
        actor = ray.remote(num_cpus=1)(DeviceGroup)
        self.owner: dict[str, int] = {}
        self._actors = []
        for k, group in enumerate(groups):
            self._actors.append(actor.remote(cfg.model_dump_json(), group, threads))
            self.owner.update(dict.fromkeys(group, k))
        try:
            self.samples: dict[str, int] = {}
            for part in ray.get([a.samples.remote() for a in self._actors]):
                self.samples.update(part)
        # ray.exceptions.RayActorError and friends: a worker that cannot build its devices
        except Exception as e:
            self.close()
            raise EdgeflError(f"a Ray worker could not build its devices: {e}") from None

    @property
    def workers(self) -> int:
        return len(self._actors)

    def request(self, messages: Mapping[str, bytes], *, timeout: float | None = None,
                accept: Accept) -> dict[str, Delivery]:
        ray = _ray()
        out: dict[str, Delivery] = {}
        pending, sent = {}, {}
        for device_id, data in messages.items():  # an actor runs its calls one at a time, in order
            if device_id not in self.owner:
                out[device_id] = Delivery(device_id, None, "device is not connected")
                continue
            ref = self._actors[self.owner[device_id]].handle.remote(device_id, data)
            pending[ref], sent[device_id] = device_id, time.perf_counter()
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, _ = ray.wait(list(pending), num_returns=1, timeout=left)
            if not done:
                break
            ref = done[0]
            device_id = pending.pop(ref)
            seconds = time.perf_counter() - sent[device_id]
            try:
                reply, error = ray.get(ref)
            except Exception as e:  # the actor died (its node went away, out of memory)
                out[device_id] = Delivery(device_id, None, f"Ray worker failed: {type(e).__name__}",
                                          seconds)
                continue
            out[device_id] = (
                Delivery(device_id, None, error, seconds)
                if error is not None
                else answered(device_id, reply, seconds, accept)
            )
        for device_id in pending.values():
            out[device_id] = Delivery(device_id, None, "timeout")
        return out

    def save_models(self, run_dir: str | Path) -> None:
        from edgefl.runtime.parallel import write_models

        ray = _ray()
        for files in ray.get([a.model_files.remote() for a in self._actors]):
            write_models(run_dir, files)

    def close(self) -> None:
        ray = _ray()
        for a in self._actors:
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self._actors = []
        if self._started and ray.is_initialized():
            ray.shutdown()
