"""A run's models exported by worker processes forked from a fork server (``edgefl export --run
RUN --all``, ``edgefl simulate --export``), not by spawned interpreters that each import torch,
ONNX and ONNX Runtime and read the dataset again: the server imports them once
(:data:`edgefl.export.plan.EXPORT_PRELOAD`) and keeps the run's dataset decoded
(:func:`~edgefl.runtime.processes.start_fork_server`). Where this process has a fork server
already (``simulate --transport mqtt``: the devices'), the workers are forked from it."""

from __future__ import annotations

from collections.abc import Callable
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any


def export_context(run: Path, data_dir: str | None, workers: int | None) -> BaseContext | None:
    """The context the run's export workers come from, its fork server started now (before the
    caller imports torch: the two imports run side by side); None where the export needs no
    workers (:func:`~edgefl.export.plan.export_workers`) or the platform has no fork server."""
    from edgefl.export.deployment import run_devices
    from edgefl.export.plan import EXPORT_PRELOAD, export_workers
    from edgefl.runtime.processes import has_fork_server, start_fork_server

    config, tiers = run_devices(run)
    if not has_fork_server() or export_workers(len(tiers), workers) < 2:
        return None
    dataset = str(config.get("dataset") or "")
    data = [(dataset, data_dir or config.get("data_dir"))] if dataset else []
    return start_fork_server(data, preload=EXPORT_PRELOAD)


def export_all(run: Path, *, quantize: str | None, test_samples: int | None,
               data_dir: str | None = None,
               on_progress: Callable[..., None] | None = None) -> list[dict[str, Any]]:
    """Every device's model of a finished run to ``run``/onnx, as ``edgefl export --run RUN --all
    --out RUN/onnx`` does, in workers from :func:`export_context`."""
    from edgefl.export.run import export_run

    return export_run(run, run / "onnx", all_devices=True, data_dir=data_dir,
                      on_progress=on_progress, context=export_context(run, data_dir, None),
                      quantize=quantize, test_samples=test_samples)
