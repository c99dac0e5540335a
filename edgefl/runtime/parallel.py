"""An in-memory simulation on every core: the devices spread over worker processes.

The server and the round loop stay in this process. A device lives in one worker for the whole run
(its state stays there); :func:`device_groups` shares the devices out so that every worker gets
about the same training work (each device's samples × its model's training FLOPs per sample,
longest first onto the least loaded worker), not the same number of devices: on the demo's fleet
(five ResNet depths, Dir(0.5) shards of unequal sizes) a round-robin split left one worker with
most of the work. Each worker builds its devices through the same run assembly as the sequential
simulation and serves each with the same :class:`~edgefl.runtime.agent.DeviceAgent`, so a device
does the same computation in either
(its model, data and local randomness are seeded per device and round, never drawn from a
generator that another device advanced): for a seed, results are identical to the sequential run
at the same number of threads per device.

Workers are started once per process and reused: a pool that closes releases its workers (they
drop its devices and wait), and the next pool of the process takes them, so a benchmark or a
sweep that runs simulation after simulation pays for starting workers (a fork, imports, torch's
first operations) once, not per run (``keep=False``: they end with the pool).

The pool is a :class:`~edgefl.transport.base.Transport`. Envelopes cross the process boundary as
their bytes on a pipe, framed as ``[4-byte length][JSON control header][envelope bytes]``: no
pickle, and the replies are decoded and checked by the round loop exactly as over MQTT. Each worker
has at most one request outstanding (the next one is sent when it answers), so a large downlink
never blocks the server on a pipe while a busy worker trains (after a round's deadline passes, a
worker still busy with a late device delays its next request until it is done). A worker that dies
fails the devices it holds, as a device that crashed would; the round loop records them and goes on.
"""

from __future__ import annotations

import atexit
import gc
import json
import logging
import os
import struct
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from edgefl.config import RunConfig
from edgefl.errors import EdgeflError
from edgefl.runtime.processes import preloaded_context
from edgefl.transport.base import Accept, Delivery, answered

log = logging.getLogger(__name__)

#: Seconds a worker may take to load the data and build its devices.
START_TIMEOUT = 600.0
#: Seconds a released worker may take to drop its devices (after a request it still works on).
RELEASE_TIMEOUT = 600.0


def default_workers() -> int:
    """One worker per core this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def device_groups(ids: Sequence[str], workers: int,
                  costs: Mapping[str, float] | None = None) -> list[list[str]]:
    """``ids`` shared out over ``workers`` (at most one group per device). Without ``costs``:
    round-robin. With them (a device's expected work per round): longest first, each onto the group
    with the least work so far (ties: the lower group), every group in ``ids``' order."""
    workers = max(1, min(workers, len(ids)))
    if costs is None:
        return [list(ids[k::workers]) for k in range(workers)]
    load, owner = [0.0] * workers, {}
    for i in sorted(range(len(ids)), key=lambda i: (-float(costs[ids[i]]), i)):
        k = min(range(workers), key=lambda w: (load[w], w))
        owner[ids[i]] = k
        load[k] += float(costs[ids[i]])
    return [[d for d in ids if owner[d] == k] for k in range(workers)]


def training_costs(run) -> dict[str, float]:
    """Each device's training work per round in a run assembly: its samples × its model's
    training FLOPs per sample (what :func:`device_groups` balances)."""
    from edgefl.profiling import training_flops_per_sample

    def samples(i: int) -> int:
        return len(run.data.pool) if run.data.parts is None else len(run.data.parts[i])

    return {d: samples(i) * training_flops_per_sample(run.specs[d]) for i, d in enumerate(run.ids)}


def _send(conn: Connection, control: Mapping[str, Any], data: bytes = b"") -> None:
    head = json.dumps(control).encode()
    conn.send_bytes(struct.pack("<I", len(head)) + head + data)


def _recv(conn: Connection) -> tuple[dict[str, Any], bytes]:
    raw = conn.recv_bytes()
    (n,) = struct.unpack("<I", raw[:4])
    return json.loads(raw[4 : 4 + n]), raw[4 + n :]


class DeviceGroup:
    """Some devices of a run, built in this process by the run assembly and each served by a
    :class:`~edgefl.runtime.agent.DeviceAgent`: what a worker process or a Ray actor holds."""

    def __init__(self, cfg_json: str, ids: Sequence[str], threads: int):
        os.environ["OMP_NUM_THREADS"] = str(threads)
        import torch

        from edgefl.runtime.agent import DeviceAgent
        from edgefl.runtime.heap import fleet_heap
        from edgefl.runtime.setup import assemble

        torch.set_num_threads(threads)
        own = fleet_heap(len(ids))  # these devices' models in this process
        self.cfg = RunConfig.model_validate_json(cfg_json)
        self.run = assemble(self.cfg)
        evals = {"quick": self.run.data.evals["quick"], "test": self.run.data.evals["test"]}
        cache: dict = {}  # identical models (e.g. after averaging) are evaluated once per group
        self.agents = {
            d: DeviceAgent(
                self.run.device_half(d),
                eval_sets=evals,
                algorithm=self.cfg.algorithm,
                eval_cache=cache,
            )
            for d in ids
        }
        self.handlers = {d: own(a.handle_bytes) for d, a in self.agents.items()}

    def samples(self) -> dict[str, int]:
        return {d: len(a.half.ctx.train_data) for d, a in self.agents.items()}

    def handle(self, device_id: str, data: bytes) -> tuple[bytes | None, str | None]:
        """(reply, None), or (None, why there is none)."""
        try:
            reply = self.handlers[device_id](data)
        except Exception as e:  # the agent answers every failure itself; this is a last resort
            return None, f"{type(e).__name__}: {e}"
        return (reply, None) if reply is not None else (None, "no reply")

    def model_files(self) -> dict[str, bytes]:
        """Each device's final model file (``edgefl export`` reads it), as bytes."""
        from edgefl.models.files import model_file_bytes

        return {
            d: model_file_bytes(a.half.model, spec=self.run.specs[d], dataset=self.cfg.dataset)
            for d, a in self.agents.items()
        }


def write_models(run_dir: str | Path, files: Mapping[str, bytes]) -> None:
    from edgefl.export.checkpoint import device_model_path

    for device_id, data in files.items():
        path = device_model_path(run_dir, device_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _serve(conn: Connection) -> None:
    """A worker process: build the devices of a run when told, answer their requests, drop them
    when released, and wait for the next run, until told to close."""
    group: DeviceGroup | None = None
    while True:
        try:
            control, data = _recv(conn)
        except EOFError:  # the server went away
            return
        op = control["op"]
        if op == "build":
            group = None
            try:
                group = DeviceGroup(control["cfg"], control["ids"], control["threads"])
            except Exception as e:  # the pool reports it and stops the run
                _send(conn, {"op": "failed", "error": f"{type(e).__name__}: {e}"})
                continue
            _send(conn, {"op": "ready", "samples": group.samples()})
        elif op == "request":
            device = control["device"]
            reply, error = group.handle(device, data) if group else (None, "no devices built")
            answer = {"op": "reply", "seq": control["seq"], "device": device}
            _send(conn, answer if error is None else {**answer, "error": error}, reply or b"")
        elif op == "save":
            files = group.model_files() if group else {}
            _send(conn, {"op": "saved", "sizes": {d: len(b) for d, b in files.items()}},
                  b"".join(files.values()))
        elif op == "release":  # the run is over: its devices go, the process stays for the next
            group = None
            gc.collect()
            _send(conn, {"op": "released"})
        elif op == "close":
            return


@dataclass
class _Worker:
    conn: Connection
    proc: Any  # a multiprocessing Process


#: Workers whose pool closed, alive and holding no devices: the next pool of this process takes
#: them instead of starting its own (:class:`WorkerPool`'s ``keep``).
_IDLE: list[_Worker] = []


def idle_pids() -> list[int]:
    """The process ids of the live workers of this process that wait for the next pool."""
    return [w.proc.pid for w in _IDLE if w.proc.is_alive()]


def close_idle_workers() -> None:
    """End the workers that wait for the next pool (at exit, or to start afresh)."""
    while _IDLE:
        _end(_IDLE.pop())


def _end(w: _Worker) -> None:
    try:
        _send(w.conn, {"op": "close"})
    except (OSError, ValueError):
        pass
    w.proc.join(timeout=10)
    if w.proc.is_alive():
        w.proc.kill()
        w.proc.join()
    w.conn.close()


atexit.register(close_idle_workers)


def _take_worker(k: int) -> _Worker:
    """An idle worker of this process, else a new one: forked from a fork server that only
    imported torch (forking this process would copy torch's thread pools and locks); spawned
    where there is none."""
    while _IDLE:
        w = _IDLE.pop(0)
        if w.proc.is_alive():
            return w
        w.conn.close()
    ctx = preloaded_context()
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(child,), name=f"edgefl-worker-{k}", daemon=True)
    proc.start()
    child.close()
    return _Worker(parent, proc)


class WorkerPool:
    """``workers`` processes holding ``ids``' devices; a :class:`Transport` for the round loop.

    ``threads``: torch threads per worker (default: the cores shared out, at least one), so the
    machine is not oversubscribed. ``costs``: each device's expected work, to balance the workers
    (:func:`device_groups`; None: round-robin). :attr:`samples` gives each device's number of
    training samples once the workers are ready. The workers are those an earlier pool of this
    process released, else new ones; ``keep``: :meth:`close` releases them for the next pool
    (False: it ends them)."""

    def __init__(self, cfg: RunConfig, ids: Sequence[str], workers: int, *,
                 threads: int | None = None, costs: Mapping[str, float] | None = None,
                 keep: bool = True):
        if workers < 1:
            raise EdgeflError(f"workers must be >= 1 (got {workers})")
        groups = device_groups(ids, workers, costs)
        workers = len(groups)
        self.threads = threads or max(1, default_workers() // workers)
        self.keep = keep
        self._workers: list[_Worker] = []
        self.owner: dict[str, int] = {}
        self.samples: dict[str, int] = {}
        self._seq = 0
        try:
            for k, group in enumerate(groups):
                w = _take_worker(k)
                self._workers.append(w)
                _send(w.conn, {"op": "build", "cfg": cfg.model_dump_json(), "ids": group,
                               "threads": self.threads})
                self.owner.update(dict.fromkeys(group, k))
            for k, conn in enumerate(self._conns):
                if not conn.poll(START_TIMEOUT):
                    raise EdgeflError(f"worker {k} did not start within {START_TIMEOUT:.0f} s")
                control, _ = _recv(conn)
                if control["op"] != "ready":
                    raise EdgeflError(
                        f"worker {k} could not build its devices: {control.get('error')}")
                self.samples.update(control["samples"])
        except (EOFError, OSError) as e:
            self.close()
            raise EdgeflError(f"a worker process exited while starting: {e}") from None
        except BaseException:
            self.close()
            raise

    @property
    def _conns(self) -> list[Connection]:
        return [w.conn for w in self._workers]

    @property
    def _procs(self) -> list:
        return [w.proc for w in self._workers]

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids, in worker order."""
        return [w.proc.pid for w in self._workers]

    @property
    def workers(self) -> int:
        return len(self._conns)

    def request(self, messages: Mapping[str, bytes], *, timeout: float | None = None,
                accept: Accept) -> dict[str, Delivery]:
        self._seq += 1
        seq = self._seq
        out: dict[str, Delivery] = {}
        queues: dict[int, deque[str]] = {}
        for device_id in messages:
            if device_id not in self.owner:
                out[device_id] = Delivery(device_id, None, "device is not connected")
            else:
                queues.setdefault(self.owner[device_id], deque()).append(device_id)
        sent: dict[str, float] = {}
        busy: dict[int, str] = {}  # worker → the device whose request it is working on

        def send_next(k: int) -> None:
            while queues.get(k):
                device_id = queues[k].popleft()
                try:
                    _send(self._conns[k], {"op": "request", "seq": seq, "device": device_id},
                          messages[device_id])
                except (OSError, ValueError) as e:  # a dead worker: its devices fail
                    out[device_id] = Delivery(device_id, None, f"worker process is gone: {e}")
                    continue
                sent[device_id], busy[k] = time.perf_counter(), device_id
                return
            busy.pop(k, None)

        for k in queues:
            send_next(k)
        deadline = None if timeout is None else time.monotonic() + timeout
        while busy:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            by_conn = {self._conns[k]: k for k in busy}
            for conn in wait(list(by_conn), left):
                k = by_conn[conn]
                try:
                    control, data = _recv(conn)
                except (EOFError, OSError):
                    code = self._procs[k].exitcode
                    for device_id in [busy.pop(k)] + list(queues.pop(k, ())):
                        out[device_id] = Delivery(device_id, None,
                                                  f"worker process exited (code {code})")
                    continue
                if control.get("seq") != seq:  # the answer to a request that timed out earlier
                    continue
                device_id = control["device"]
                seconds = time.perf_counter() - sent[device_id]
                if "error" in control:
                    out[device_id] = Delivery(device_id, None, str(control["error"]), seconds)
                else:
                    out[device_id] = answered(device_id, data, seconds, accept)
                send_next(k)
        for device_id in messages:
            if device_id not in out:
                out[device_id] = Delivery(device_id, None, "timeout")
        return out

    def save_models(self, run_dir: str | Path) -> None:
        """Each device's final model under ``run_dir/models`` (the workers send the files)."""
        for conn in self._conns:
            _send(conn, {"op": "save"})
        for k, conn in enumerate(self._conns):
            try:
                # a late answer to a timed-out request
                while (message := _recv(conn))[0]["op"] == "reply":
                    pass
            except (EOFError, OSError):
                raise EdgeflError(f"worker {k} exited before sending its devices' models") from None
            control, data = message
            if control["op"] != "saved":
                raise EdgeflError(f"worker {k} could not save its models: {control}")
            files, at = {}, 0
            for device_id, size in control["sizes"].items():
                files[device_id], at = data[at : at + size], at + size
            write_models(run_dir, files)

    def close(self) -> None:
        """Release the workers: with ``keep``, each live one drops this run's devices and waits
        for the next pool of this process (:func:`close_idle_workers` ends them); else it ends."""
        for w in self._workers:
            if self.keep and w.proc.is_alive() and self._release(w):
                _IDLE.append(w)
            else:
                _end(w)
        self._workers = []

    @staticmethod
    def _release(w: _Worker) -> bool:
        """Whether ``w`` dropped its devices (a late answer to a timed-out request comes first)."""
        try:
            _send(w.conn, {"op": "release"})
            while w.conn.poll(RELEASE_TIMEOUT):
                if _recv(w.conn)[0]["op"] == "released":
                    return True
        except (EOFError, OSError, ValueError):
            pass
        return False
