"""Export the trained models of a run directory (or a model file) — what `edgefl export` calls.

    results = export_run("runs/my-run", "onnx/", all_devices=True, quantize="int8")
    results = export_checkpoint("d03.safetensors", "d03.onnx", dataset="fashion-mnist")

For each chosen device: load run_dir/models/<id>.safetensors (with ``all_devices``, a device of
a fleet run that sent no final model is skipped and reported as such), export to ONNX with the
dataset's class names, check parity on real test samples (batch 1 and 7), measure fp32 accuracy on
the test split, and with `quantize="int8"` write <name>.int8.onnx calibrated on training samples
and measure its accuracy on the same test samples (before/after).

Output naming: one model and `out` ending in ".onnx" → that file; otherwise `out` is a
directory holding <device_id>.onnx (and <device_id>.int8.onnx). `tier` exports one model per
tier: that of the first device (by id) holding the tier.

Several models are exported by ``workers`` processes at once (default: one per core, at most one
per :data:`~edgefl.export.plan.MODELS_PER_WORKER` models), each with its share of the cores'
threads and the same checks; a model's files and report do not depend on how many worked beside
it. ``edgefl export`` forks them from a fork server that imported the export and decoded the
run's dataset once (:mod:`edgefl.export.plan`).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import zlib
from collections.abc import Callable
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any

import numpy as np

from edgefl.errors import ConfigError, DataNotFoundError
from edgefl.export.checkpoint import device_model_path, load_device_model, read_model_file
from edgefl.export.deployment import run_devices
from edgefl.export.onnx_export import (
    DEFAULT_OPSET,
    DEFAULT_TOLERANCE,
    export_model,
    uses_batch_statistics,
)
from edgefl.export.plan import export_workers
from edgefl.export.quantize import FORMATS, quantize_int8
from edgefl.inference import Predictor
from edgefl.models import EdgeModel

log = logging.getLogger(__name__)

QUANTIZE_CHOICES = ("int8",)
PARITY_SAMPLES = 56  # 56 = 8 batches of 7, 56 of 1


def choose_devices(
    tiers: dict[str, str], *, device: str | None, tier: str | None, all_devices: bool
) -> list[str]:
    if sum([device is not None, tier is not None, all_devices]) != 1:
        raise ConfigError("choose exactly one of --device ID, --tier T or --all")
    if device is not None:
        if device not in tiers:
            raise ConfigError(
                f"the run has no device {device!r}; devices: {', '.join(sorted(tiers))}"
            )
        return [device]
    if tier is not None:
        holders = sorted(d for d, t in tiers.items() if t == tier)
        if not holders:
            raise ConfigError(
                f"no device of the run has tier {tier!r}; tiers: "
                f"{', '.join(sorted(set(tiers.values())))}"
            )
        return holders[:1]
    return sorted(tiers)


def _out_paths(out: Path, names: list[str]) -> list[Path]:
    if len(names) == 1 and out.suffix == ".onnx":
        return [out]
    if out.suffix == ".onnx":
        raise ConfigError(f"{len(names)} models to export: --out must be a directory, not {out}")
    return [out / f"{name}.onnx" for name in names]


class _Data:
    """Test and training samples of the dataset the models were trained on, loaded once.

    A machine without that dataset (a fleet's server: the devices hold the data) still exports:
    the ONNX model is checked against PyTorch on seeded random images of the model's input shape,
    the accuracy is not measured, and int8 (which calibrates on training images) is refused."""

    def __init__(self, dataset: str, data_dir: str | None, seed: int, missing: str | None = None):
        from edgefl.data import dataset_info, load_dataset

        self.dataset, self.data_dir, self.seed, self.missing = dataset, data_dir, seed, missing
        if missing is not None:  # known absent (an export worker of a machine without it)
            self.test = self.train = None
            self.info = dataset_info(dataset)
            self.class_names = list(self.info.class_names)
            return
        try:
            self.test = load_dataset(dataset, "test", data_dir)
            self.train = load_dataset(dataset, "train", data_dir)
            self.info = self.test.info
        except DataNotFoundError as e:
            self.test = self.train = None
            self.info = dataset_info(dataset)
            self.missing = f"{e}".split(". Looked in")[0]
            log.warning(
                "%s: the models are checked against PyTorch on %d random images, their accuracy is "
                "not measured (pass --data-dir to measure it)",
                self.missing,
                PARITY_SAMPLES,
            )
        self.class_names = list(self.info.class_names)

    def parity_images(self):
        if self.test is None:
            import torch

            g = torch.Generator().manual_seed(self.seed)
            return torch.rand((PARITY_SAMPLES, *self.info.in_shape), generator=g)
        return self.test.images(np.arange(min(PARITY_SAMPLES, len(self.test))))

    def calibration_images(self, n: int, key: str):
        """Calibration samples drawn for ``key`` (a device id) alone: exporting one device gives
        the same file whether or not other devices are exported in the same call."""
        if self.train is None:
            return None
        rng = np.random.default_rng([self.seed, 8, zlib.crc32(key.encode())])
        idx = np.sort(rng.choice(len(self.train), size=min(n, len(self.train)), replace=False))
        return self.train.images(idx)


def export_one(
    model: EdgeModel,
    out_path: Path,
    data: _Data,
    *,
    opset: int = DEFAULT_OPSET,
    quantize: str | None = None,
    int8_format: str = "qdq",
    calibration_samples: int = 256,
    test_samples: int | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    metadata: dict[str, str] | None = None,
    threads: int | None = None,
) -> dict[str, Any]:
    """Export one model (and its int8 version); returns a JSON-safe report. ``threads``: ONNX
    Runtime's intra-op threads for the parity check and the evaluations (None: its default, which
    an export worker overrides with its share of the cores)."""
    if quantize is not None and quantize not in QUANTIZE_CHOICES:
        raise ConfigError(f"--quantize {quantize!r}; choose one of: {', '.join(QUANTIZE_CHOICES)}")
    if int8_format not in FORMATS:
        raise ConfigError(f"--int8-format {int8_format!r}; choose one of: {', '.join(FORMATS)}")
    if calibration_samples < 1:
        raise ConfigError(f"--calibration-samples must be positive, got {calibration_samples}")
    if tuple(data.info.in_shape) != tuple(model.spec.in_shape):
        raise ConfigError(
            f"{model.spec.name} takes inputs {model.spec.in_shape}, but dataset "
            f"{data.info.name!r} has {data.info.in_shape}; pass the dataset it was trained on"
        )
    if quantize == "int8" and data.missing:
        raise ConfigError(f"--quantize int8 calibrates on training images: {data.missing}")
    if data.missing and uses_batch_statistics(model):
        raise ConfigError(
            f"{model.spec.name} freezes its batch statistics on training images: {data.missing}"
        )
    key = (metadata or {}).get("edgefl.device_id") or out_path.stem
    calibration = data.calibration_images(calibration_samples, key)
    report = export_model(
        model,
        out_path,
        opset=opset,
        class_names=data.class_names,
        parity_images=data.parity_images(),
        tolerance=tolerance,
        calibration_images=calibration,
        metadata=metadata,
        threads=threads,
    )
    result: dict[str, Any] = report.to_dict()
    if data.missing:
        result["accuracy_not_measured"] = data.missing
    elif test_samples != 0:
        result["accuracy"] = Predictor(out_path, threads=threads).evaluate(
            data.test, limit=test_samples)["accuracy"]
    if quantize == "int8":
        q = quantize_int8(
            out_path, out_path.with_suffix(".int8.onnx"), calibration, format=int8_format
        )
        result["int8"] = q.to_dict()
        if test_samples != 0:
            result["int8"]["accuracy"] = Predictor(q.path, threads=threads).evaluate(
                data.test, limit=test_samples)["accuracy"]
    return result


def export_run(
    run_dir: str | Path,
    out: str | Path,
    *,
    device: str | None = None,
    tier: str | None = None,
    all_devices: bool = False,
    data_dir: str | None = None,
    on_progress: Callable[..., None] | None = None,
    workers: int | None = None,
    context: BaseContext | None = None,
    **options: Any,
) -> list[dict[str, Any]]:
    """Export the chosen devices' models of a run; `options` go to `export_one`. ``workers``
    processes export at once (None: one per core, at most one per ``MODELS_PER_WORKER`` models;
    1: in this process), started from ``context`` (None: spawned, fresh interpreters; the CLI
    gives that of a fork server which imported the export once:
    :data:`~edgefl.export.plan.EXPORT_PRELOAD`).
    ``on_progress("export", None, done, total, names=[device])`` as each model starts (in this
    process) or is done (in workers), and at the end."""
    config, tiers = run_devices(run_dir)
    ids = choose_devices(tiers, device=device, tier=tier, all_devices=all_devices)
    skipped = []
    if all_devices:
        # a fleet run: a device offline at the end sent no final model (its summary names it)
        skipped = [d for d in ids if not device_model_path(run_dir, d).is_file()]
        if len(skipped) == len(ids):
            load_device_model(run_dir, ids[0])  # raises, naming where the models should be
        for d in skipped:
            log.warning(
                "skipping %s: the run has no final model of it (%s)",
                d,
                device_model_path(run_dir, d),
            )
        ids = [d for d in ids if d not in skipped]
    data = _Data(
        config.get("dataset", ""), data_dir or config.get("data_dir"), int(config.get("seed", 0))
    )
    tasks = [
        (
            str(run_dir),
            device_id,
            path,
            {
                "edgefl.device_id": device_id,
                "edgefl.run": Path(run_dir).resolve().name,
                "edgefl.algorithm": str(config.get("algorithm", "")),
                "edgefl.dataset": str(config.get("dataset", "")),
            },
            options,
        )
        for device_id, path in zip(ids, _out_paths(Path(out), ids), strict=True)
    ]
    cores = os.cpu_count() or 1
    workers = export_workers(len(tasks), workers)
    if workers == 1:
        results = []
        for i, task in enumerate(tasks):
            if on_progress is not None:
                on_progress("export", None, i, len(ids), names=[task[1]])
            results.append(_export_task(*task, data=data))
    else:
        results = _export_parallel(tasks, data, workers, max(1, cores // workers), on_progress,
                                   context or multiprocessing.get_context("spawn"))
    if on_progress is not None:
        on_progress("export", None, len(ids), len(ids))
    results += [
        {
            "device_id": d,
            "skipped": f"no final model ({device_model_path(run_dir, d)} is missing: "
            "the device did not answer the end of the run)",
        }
        for d in skipped
    ]
    return results


def _export_task(
    run_dir: str,
    device_id: str,
    path: Path,
    meta: dict[str, str],
    options: dict[str, Any],
    data: _Data | None = None,
) -> dict[str, Any]:
    """One device's export (in this process, or in an export worker with its own data)."""
    if data is None:  # an export worker: its data, and its share of the cores for ONNX Runtime
        data, options = _WORKER["data"], {"threads": _WORKER["threads"], **options}
    model = load_device_model(run_dir, device_id)
    log.info("exporting %s (%s) to %s", device_id, model.spec.name, path)
    return {"device_id": device_id, **export_one(model, path, data, metadata=meta, **options)}


#: an export worker's state: the dataset's samples, loaded once per worker, and its threads
_WORKER: dict[str, Any] = {}


def _worker_start(dataset: str, data_dir: str | None, seed: int, missing: str | None,
                  threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    logging.basicConfig(level=logging.WARNING)
    _WORKER["data"] = _Data(dataset, data_dir, seed, missing=missing)
    # ONNX Runtime too: by default it starts a thread per core in each session, and spins them;
    # beside the other workers that doubled the CPU and the time of an evaluation
    _WORKER["threads"] = threads


def _export_parallel(tasks: list[tuple], data: _Data, workers: int, threads: int,
                     on_progress: Callable[..., None] | None,
                     context: BaseContext) -> list[dict[str, Any]]:
    """``tasks`` exported by ``workers`` processes of ``context`` (never forked from this one: it
    may have torch's thread pools running, which a fork would copy half-made), results in the
    order of ``tasks``."""
    from concurrent.futures import ProcessPoolExecutor, as_completed

    results: list[dict[str, Any] | None] = [None] * len(tasks)
    init = (data.dataset, data.data_dir, data.seed, data.missing, threads)
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_start,
                             initargs=init) as pool:
        futures = {pool.submit(_export_task, *task): i for i, task in enumerate(tasks)}
        try:
            for done, future in enumerate(as_completed(futures), 1):
                i = futures[future]
                results[i] = future.result()
                if on_progress is not None and done < len(tasks):
                    on_progress("export", None, done, len(tasks), names=[tasks[i][1]])
        except BaseException:  # the first failure (or Ctrl-C) ends the export: no more models
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return [r for r in results if r is not None]


def export_checkpoint(
    checkpoint: str | Path,
    out: str | Path,
    *,
    dataset: str | None = None,
    data_dir: str | None = None,
    seed: int = 0,
    **options: Any,
) -> list[dict[str, Any]]:
    """Export one model file (safetensors with spec metadata, see `save_model_file`)."""
    from edgefl.export.checkpoint import load_model_file

    _, _, meta = read_model_file(checkpoint)
    dataset = dataset or meta.get("dataset")
    if not dataset:
        raise ConfigError(f"{checkpoint} does not name its dataset; pass --dataset")
    model = load_model_file(checkpoint)
    (path,) = _out_paths(Path(out), [Path(checkpoint).stem])
    data = _Data(dataset, data_dir, seed)
    return [export_one(model, path, data, metadata={"edgefl.dataset": dataset}, **options)]
