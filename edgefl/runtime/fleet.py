"""A whole fleet over real MQTT on one machine: a broker, the server, one OS process per device.

``simulate_mqtt(cfg)`` is ``edgefl simulate --transport mqtt``: the same run as the in-memory
simulation (same shards, tiers, seeds), but every device is an ``edgefl train`` process talking
to the server (in this process) through a broker — the embedded amqtt one unless a URL is given.
Device *i* of :func:`~edgefl.runtime.setup.plan_fleet` (the fleet file's devices and the tiers
its tier policy chooses, or d00, d01, … with the run's tiers in turn) gets shard *i* of the
partition the simulator makes and its tier, so results match the in-memory run for the same seed.

Device processes are forked from a fork server that has already imported torch and edgefl
(:class:`DeviceLauncher`, :mod:`edgefl.runtime.processes`), so a fleet of N processes does not pay N
interpreter start-ups and torch imports (1.7 s of CPU each, measured): each is still its own OS
process running ``edgefl train`` with its own MQTT connection. The fork server is started first
(:func:`~edgefl.runtime.processes.start_fork_server`), so its imports run while the broker and
the server start, and it decodes the run's dataset once: the devices copy it from memory.
Without an entry point to fork into, or where the platform has no fork server (Windows), each
device is a fresh ``python -m edgefl.cli.main train`` (:func:`start_device`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from edgefl.config import RunConfig
from edgefl.errors import ConfigError
from edgefl.privacy.declare import REPEATABLE_NOISE_ENV
from edgefl.runtime.dataspec import DataSpec
from edgefl.runtime.derived import run_dir_for
from edgefl.runtime.method import Method, resolve_method
from edgefl.runtime.processes import has_fork_server, preloaded_context, start_fork_server
from edgefl.runtime.server import ServeOptions, serve
from edgefl.runtime.setup import plan_fleet
from edgefl.transport.broker import EmbeddedBroker

log = logging.getLogger(__name__)

#: A fixed, modest profile for simulated devices (no benchmark per process; the tier is given).
SIMULATED_PROFILE = {
    "name": "simulated",
    "arch": "x86_64",
    "cpu_model": "simulated",
    "cores": 1,
    "ram_total_mb": 4096,
    "ram_available_mb": 2048,
    "source": "edgefl simulate --transport mqtt",
}


def data_spec_for(cfg: RunConfig, index: int) -> DataSpec:
    """Device ``index``'s shard, exactly as ``simulate`` partitions ``cfg``'s dataset."""
    return DataSpec.from_config(cfg, index)


def device_command(
    broker: str,
    fleet: str,
    device_id: str,
    data: DataSpec | str,
    *,
    tier: str | None = None,
    profile_file: Path | None = None,
    delay: float = 0.0,
    threads: int | None = 1,
    train_device: str | None = None,
    verbose: bool = False,
    save_model: Path | None = None,
) -> list[str]:
    cmd = [sys.executable, "-m", "edgefl.cli.main"]
    if verbose:
        cmd.append("--verbose")
    cmd += ["train", "--broker", broker, "--fleet", fleet, "--device-id", device_id]
    cmd += ["--data", data.to_string() if isinstance(data, DataSpec) else data]
    if tier:
        cmd += ["--tier", tier]
    if profile_file is not None:
        cmd += ["--profile", str(profile_file)]
    if delay:
        cmd += ["--delay", str(delay)]
    if threads:
        cmd += ["--threads", str(threads)]
    if train_device:
        cmd += ["--train-device", train_device]
    if save_model is not None:
        cmd += ["--save-model", str(save_model)]
    return cmd


def start_device(cmd: Sequence[str], log_path: Path | None = None,
                 extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    out = open(log_path, "ab") if log_path is not None else subprocess.DEVNULL  # noqa: SIM115
    env = {**os.environ, **(extra_env or {}), "PYTHONUNBUFFERED": "1"}
    try:
        return subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, env=env)
    finally:
        if log_path is not None:
            out.close()


def _device_main(entry: Callable[[], None], argv: list[str], log_path: str | None,
                 environ: dict[str, str]) -> None:
    """A forked device process: ``edgefl <argv>`` with stdout and stderr going to ``log_path``, in
    the environment the launcher had when it started this device (the fork server's own is the
    one it was started with; what torch reads when it is imported, such as OMP_*, stays that)."""
    os.environ.clear()
    os.environ.update(environ)
    if log_path is not None:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
    sys.argv = ["edgefl", *argv]
    entry()


class DeviceProcess:
    """A device process forked by :class:`DeviceLauncher`, with the part of ``Popen``'s interface
    a fleet needs (``pid``, ``poll``, ``wait``, ``terminate``, ``kill``, ``returncode``)."""

    def __init__(self, process: multiprocessing.process.BaseProcess):
        self.process = process

    @property
    def pid(self) -> int | None:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def poll(self) -> int | None:
        return self.process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(f"device process {self.pid}", timeout or 0.0)
        return self.process.exitcode

    def terminate(self) -> None:
        self.process.terminate()

    def kill(self) -> None:
        self.process.kill()


class DeviceLauncher:
    """Starts ``edgefl train`` device processes: forked from a fork server that imported torch and
    edgefl once, into ``entry`` (the ``edgefl`` command's entry point, which reads ``sys.argv``,
    given by the CLI layer that owns it); exec'd one by one without an entry point or where the
    platform has no fork server."""

    def __init__(self, entry: Callable[[], None] | None = None):
        self.entry = entry
        self.ctx = preloaded_context() if entry is not None and has_fork_server() else None

    @property
    def launch(self) -> str:
        return "fork" if self.ctx is not None else "exec"

    def start(
        self, cmd: Sequence[str], log_path: Path | None = None, env: dict[str, str] | None = None
    ) -> DeviceProcess | subprocess.Popen:
        """``cmd`` as :func:`device_command` makes it: ``python -m edgefl.cli.main ARGS…``; ``env``
        is added to the device's environment."""
        if self.ctx is None or list(cmd[:3]) != [sys.executable, "-m", "edgefl.cli.main"]:
            return start_device(cmd, log_path, env)
        argv = list(cmd)[3:]
        log = None if log_path is None else str(log_path)
        environ = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        process = self.ctx.Process(target=_device_main, args=(self.entry, argv, log, environ),
                                   name="edgefl-device", daemon=False)
        process.start()
        return DeviceProcess(process)


def _import_while_the_fork_server_does() -> None:
    """What the server imports later, imported now: this process would otherwise wait here for the
    fork server's imports before its first device starts. torch's compiler front end, which the
    server's first optimizer imports (Velo's CVAE, a server optimizer): about 1 s of CPU in the
    first round's aggregation while every device waits; matplotlib, for the plots at the end
    (0.7 s of CPU after the last round)."""
    import torch._dynamo  # noqa: F401

    import edgefl.report.plots  # noqa: F401


def simulate_mqtt(
    cfg: RunConfig,
    *,
    broker: str | None = None,
    fleet: str | None = None,
    deadline: float = 600.0,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    on_progress: Callable[..., None] | None = None,
    verbose: bool = False,
    entry: Callable[[], None] | None = None,
    say: Callable[[str], None] | None = None,
    method: Method | None = None,
) -> dict[str, Any]:
    """``cfg``'s run with a broker, this process as the server and one process per device
    (forked from a fork server into ``entry``, the CLI's entry point, or exec'd without one:
    :class:`DeviceLauncher`). ``method``: ``cfg``'s method as
    :func:`~edgefl.runtime.method.configure` resolved it (None: resolved here)."""
    if cfg.validation_samples:
        raise ConfigError(
            "validation_samples is for in-memory tuning runs; the MQTT fleet evaluates on the "
            "test split")
    launcher = DeviceLauncher(entry)
    if launcher.ctx is not None:  # its imports and the data run beside the broker and the server
        start_fork_server([(cfg.dataset, cfg.data_dir)])
    method = method or resolve_method(cfg.algorithm, cfg.options, cfg.public_fraction)
    # a simulation repeats: its devices too (below)
    method = dataclasses.replace(method, repeatable_noise=True)
    plan = plan_fleet(cfg, method)  # the devices and tiers the in-memory run has
    embedded = None
    if broker is None:
        embedded = EmbeddedBroker(port=0).start()
        broker = embedded.url
    fleet = fleet or f"sim-{os.getpid()}"
    run_dir = run_dir_for(cfg)
    cfg = cfg.model_copy(update={"run_name": run_dir.name})  # the server must write to the same dir
    log_dir = run_dir / "device-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    if launcher.ctx is not None:
        _import_while_the_fork_server_does()
    procs: list[DeviceProcess | subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="edgefl-fleet-") as tmp:
        profiles = plan.profiles()  # a fleet file's profiles; without one, the simulated profile
        threads = max(1, (os.cpu_count() or 1) // max(1, cfg.clients))
        try:
            for i, device_id in enumerate(plan.ids):
                profile_file = Path(tmp) / f"{device_id}.json"
                profile_file.write_text(json.dumps(profiles.get(device_id, SIMULATED_PROFILE)))
                cmd = device_command(
                    broker, fleet, device_id, data_spec_for(cfg, i), tier=plan.tiers[device_id],
                    profile_file=profile_file, threads=threads, train_device=cfg.train_device,
                    verbose=verbose,
                )
                procs.append(launcher.start(cmd, log_dir / f"{device_id}.log",
                                            {REPEATABLE_NOISE_ENV: "1"}))
            opts = ServeOptions(broker=broker, fleet=fleet, deadline=deadline,
                                wait_for_devices=max(120.0, 20.0 * cfg.clients))
            full = cfg.model_copy(update={"min_devices": cfg.clients})
            # the devices send their final models to the server, which writes run_dir/models
            # (edgefl.runtime.ending)
            summary = serve(full, opts, on_round=on_round, on_progress=on_progress, say=say,
                            method=method)
            summary["broker"] = "embedded amqtt" if embedded else broker
            summary["device_processes"] = len(procs)
            return summary
        finally:
            for p in procs:
                try:
                    p.wait(timeout=60)  # devices leave once the run is over
                except subprocess.TimeoutExpired:
                    p.terminate()
                    p.wait(timeout=10)
            if embedded is not None:
                embedded.stop()
