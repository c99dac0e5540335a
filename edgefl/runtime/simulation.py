"""A whole fleet on one machine: the same algorithm objects and round loop, in-memory transport."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from edgefl.algorithms import DeviceRecord, ServerHalf
from edgefl.config import RunConfig
from edgefl.errors import ConfigError
from edgefl.export.checkpoint import save_device_models
from edgefl.runtime.agent import DeviceAgent
from edgefl.runtime.clock import fleet_clock
from edgefl.runtime.derived import run_dir_for
from edgefl.runtime.heap import fleet_heap
from edgefl.runtime.method import Method
from edgefl.runtime.run import Ending, RunLifecycle, loop_settings
from edgefl.runtime.setup import assemble, build_server
from edgefl.transport import Encoded, InMemoryTransport

log = logging.getLogger(__name__)


def simulate(
    cfg: RunConfig,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    *,
    plots: bool = True,
    on_done: Callable[[ServerHalf], None] | None = None,
    workers: int = 1,
    backend: str = "processes",
    ray_address: str | None = None,
    on_progress: Callable[..., None] | None = None,
    on_event: Callable[[str, dict[str, Any]], None] | None = None,
    method: Method | None = None,
) -> dict[str, Any]:
    """Run ``cfg`` in memory; writes config, rounds.jsonl, summary and (``plots``) plots to the
    run dir. ``on_done`` is given the server half when the run is over (as ``serve`` does).

    ``workers`` > 1 trains the devices in that many worker processes
    (:mod:`edgefl.runtime.parallel`), each with ``cfg.threads`` torch threads (default: the cores
    shared out); ``backend="ray"`` in that many Ray actors (:mod:`edgefl.runtime.ray_pool`;
    ``ray_address`` joins an existing cluster). The results are those of the sequential run at the
    same threads per device. ``on_progress`` follows each exchange, ``on_event`` hears of the final
    evaluation (:class:`~edgefl.runtime.loop.RoundLoop`). ``method``: ``cfg``'s method as
    :func:`~edgefl.runtime.method.configure` resolved it (None: resolved here).

    Ctrl-C ends the run with the rounds completed: rounds.jsonl, the summary (each device's last
    per-round evaluation, marked interrupted), the plots and the models as they are are written,
    then :class:`~edgefl.errors.RunInterrupted` is raised."""
    t_start = time.perf_counter()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.aggregation == "async" and (workers > 1 or backend != "processes"):
        raise ConfigError(
            "--aggregation async runs its devices one at a time in this process: leave --workers "
            "at 1 and --backend at processes")
    run = assemble(cfg, method)
    quick, test = run.data.evals["quick"], run.data.evals["test"]
    halves = {}
    if backend not in ("processes", "ray"):
        raise ConfigError(f"backend must be processes or ray, got {backend!r}")
    if backend == "ray":
        from edgefl.runtime.parallel import training_costs
        from edgefl.runtime.ray_pool import RayPool

        pool = RayPool(cfg, run.ids, workers, address=ray_address, threads=cfg.threads or 1,
                       costs=training_costs(run))
        transport, samples = Encoded(pool), pool.samples
    elif workers > 1:
        from edgefl.runtime.parallel import WorkerPool, training_costs

        pool = WorkerPool(cfg, run.ids, workers, threads=cfg.threads, costs=training_costs(run))
        transport, samples = Encoded(pool), pool.samples
    else:
        own = fleet_heap(len(run.ids))  # every device's model in this process
        transport = InMemoryTransport()
        eval_cache: dict = {}
        for d in run.ids:
            halves[d] = half = run.device_half(d)
            agent = DeviceAgent(
                half, eval_sets={"quick": quick, "test": test}, algorithm=cfg.algorithm,
                eval_cache=eval_cache
            )
            transport.connect(d, own(agent.handle))
        samples = {d: len(h.ctx.train_data) for d, h in halves.items()}
    try:
        return _run(cfg, run, transport, samples, halves, on_round, plots, on_done, t_start,
                    on_progress, on_event)
    finally:
        transport.close()


def _run(cfg, run, transport, samples, halves, on_round, plots, on_done, t_start, on_progress=None,
         on_event=None) -> dict[str, Any]:
    specs, test, public = run.specs, run.data.evals["test"], run.data.public
    fleet = {d: DeviceRecord(spec=specs[d], num_samples=samples[d]) for d in run.ids}
    server_ctx = run.server_context(fleet)
    run_dir = run_dir_for(cfg)
    life = RunLifecycle(cfg, run.method, run_dir, on_round=on_round, plots=plots, started=t_start)
    # a fleet file: the simulated wall clock
    clock = fleet_clock(run.fleet_file, server_ctx, cfg.seed)
    loop = life.loop(build_server(run.method, server_ctx), server_ctx, transport,
                     loop_settings(cfg),
                     on_progress=on_progress, on_event=on_event, clock=clock)

    def save_models(final: dict[str, Any]) -> dict[str, Any]:
        # Each device's final model, for `edgefl export` (safetensors with the spec in its
        # metadata).
        try:
            if halves:
                save_device_models(run_dir, {d: h.model for d, h in halves.items()}, specs=specs,
                                   dataset=cfg.dataset)
            else:
                transport.wire.save_models(run_dir)
        except Exception as e:  # noqa: BLE001
            # interrupted, worker processes may be gone with Ctrl-C
            if not final["interrupted"]:
                raise
            log.warning("the models of the interrupted run could not be saved: %s", e)
        return {"test_samples": len(test),
                **({"simulated_seconds": loop.simulated_seconds} if clock is not None else {})}

    fleet_file = run.fleet_file
    config = {
        **({"profiles": {d: p.name for d, p in fleet_file.devices}} if fleet_file else {}),
        "public_samples": 0 if public is None else len(public),
    }
    return life.run(Ending(config=lambda: config, save_models=save_models), on_done)
