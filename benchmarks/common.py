"""Helpers shared by the timing benchmarks (inference, overhead, scale, mqtt_demo): machine load,
results, memory watching and the device processes of the MQTT benchmarks; and what the accuracy
benchmarks' declarations share (their profile's common settings, the lr decay's rounds).

The accuracy benchmarks are declarations on :mod:`benchmarks.runner`."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import psutil


def machine() -> dict:
    """What a timing needs next to it: the machine, how loaded it was, and this process's
    niceness (:mod:`benchmarks.timing`, the harness, records the rest of the invocation)."""
    from benchmarks.timing import cpu_model, load, niceness

    return {
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "ram_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "loadavg_1_5_15": load(),
        "niceness": niceness(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def device_class_counts(config: dict) -> dict[str, tuple[str, list[int]]]:
    """Per device of a run: its tier and its training images per class, rebuilt from the run's
    configuration (same seed, same partition). Keys of ``config`` that are not run settings (a
    benchmark's bookkeeping, a saved run's additions) are ignored."""
    import numpy as np

    from edgefl.config import RunConfig
    from edgefl.runtime.setup import assemble

    built = assemble(
        RunConfig.model_validate({k: v for k, v in config.items() if k in RunConfig.model_fields})
    )
    # a device's shard (the partition indexes the pool left after the server's public carve-out)
    return {
        device: (built.specs[device].tier, np.asarray(built.data.shard(i).class_counts()).tolist())
        for i, device in enumerate(built.ids)
    }


def write_json(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n")


def write_results(stem: Path, results: dict, page: Callable[[dict], list[str]]) -> dict:
    """``<stem>.json`` (the results) and ``<stem>.md`` (the lines ``page`` makes of them);
    returns the results."""
    write_json(stem.with_suffix(".json"), results)
    stem.with_suffix(".md").write_text("\n".join(page(results)) + "\n")
    return results


def measure_models(stem: Path, page: Callable[[dict], list[str]], info: dict,
                   rows: Iterable[dict]) -> dict:
    """The machine, ``info`` and every row of ``rows`` (each measured as it is drawn, and
    printed), then the load after them, written by :func:`write_results`."""
    results = {"machine": machine(), **info, "models": []}
    for row in rows:
        print(row, flush=True)
        results["models"].append(row)
    results["machine_after"] = machine()["loadavg_1_5_15"]
    return write_results(stem, results, page)


def measured_on(results: dict, threads: str) -> str:
    """How a :func:`measure_models` result was measured, for its page: "`<command>` on n cores,
    ``threads``, <date>; load average before …, after …"."""
    m = results["machine"]
    return (f"`{results['command'].strip()}` on {m['cores']} cores, {threads}, {m['date']}; load "
            f"average before {m['loadavg_1_5_15']}, after {results['machine_after']}")


def table(columns: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A Markdown table's lines: the header of ``columns``, its separator (one ``---`` per
    column) and a line per row of cells."""
    return [f"| {' | '.join(columns)} |", "|" + "---|" * len(columns),
            *(f"| {' | '.join(cells)} |" for cells in rows)]


def models_page(results: dict, title: str, threads: str, about: str, columns: Sequence[str],
                row: Callable[[dict], Sequence[str]]) -> list[str]:
    """The page of a :func:`measure_models` result: ``# title``; how it was measured
    (:func:`measured_on` with ``threads``), then ``about``; the :func:`table` of ``columns``, one
    ``row`` of cells per model."""
    return [f"# {title}", "", f"{measured_on(results, threads)}. {about}", "",
            *table(columns, map(row, results["models"]))]


class MemoryWatch:
    """Peak resident memory of named groups of processes, sampled by a thread."""

    def __init__(self, every: float = 0.2):
        self.groups: dict[str, list[psutil.Process]] = {}
        self.peak: dict[str, int] = {}
        self.every = every
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def watch(self, name: str, pids: list[int]) -> None:
        self.groups[name] = [psutil.Process(p) for p in pids]
        self.peak.setdefault(name, 0)

    def sample(self) -> dict[str, int]:
        now = {}
        for name, procs in list(self.groups.items()):
            total = 0
            for p in procs:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            now[name] = total
            self.peak[name] = max(self.peak.get(name, 0), total)
        return now

    def _run(self) -> None:
        while not self.stop_event.wait(self.every):
            self.sample()

    def start(self) -> MemoryWatch:
        self.thread.start()
        return self

    def stop(self) -> dict[str, int]:
        self.stop_event.set()
        self.thread.join(5)
        self.sample()
        return dict(self.peak)


# --- device processes of the MQTT benchmarks ------------------------------------------------------

BENCH_PROFILE = {
    "name": "bench",
    "arch": "x86_64",
    "cpu_model": "bench",
    "cores": 1,
    "ram_total_mb": 4096,
    "ram_available_mb": 2048,
    "source": "benchmark",
}


def device_specs(
    url: str, fleet: str, n: int, *, test_samples: int = 50, eval_samples: int = 50, **more
) -> list[dict]:
    """``DeviceOptions`` fields of ``n`` synthetic-data devices (tier 1, one torch thread);
    ``more``: further DataSpec fields (``train_samples``) or DeviceOptions fields
    (``register_every``)."""
    from dataclasses import fields

    from edgefl.runtime.dataspec import DataSpec
    from edgefl.runtime.device import DeviceOptions
    from edgefl.runtime.setup import device_ids

    data_fields = {f.name for f in fields(DataSpec)}
    data = {k: v for k, v in more.items() if k in data_fields}
    options = {k: v for k, v in more.items() if k not in data_fields}
    unknown = set(options) - {f.name for f in fields(DeviceOptions)}
    if unknown:
        raise ValueError(f"unknown device fields {sorted(unknown)}")
    return [
        {
            "broker": url,
            "fleet": fleet,
            "device_id": d,
            "data": DataSpec(
                "synthetic",
                shard=(i, n),
                test_samples=test_samples,
                eval_samples=eval_samples,
                min_size=5,
                **data,
            ).to_string(),
            "tier": "1",
            "profile": BENCH_PROFILE,
            "threads": 1,
            **options,
        }
        for i, d in enumerate(device_ids(n))
    ]


ROOT = Path(__file__).resolve().parents[1]


def spawn_devices(
    module: str, specs: list[dict], processes: int, work: Path, env: dict | None = None
) -> list[subprocess.Popen]:
    """``processes`` processes of ``python -m module SPEC.json`` (run from the repository root),
    the devices dealt out in turn; logs in ``work``."""
    procs = []
    for k in range(processes):
        spec_file = work / f"devices-{k}.json"
        spec_file.write_text(json.dumps(specs[k::processes]))
        with open(work / f"devices-{k}.log", "ab") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", module, str(spec_file)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=ROOT,
                )
            )
    return procs


def stop_processes(procs: list[subprocess.Popen], grace: float) -> None:
    """Give the processes ``grace`` seconds in all to leave by themselves, then terminate them."""
    end = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.terminate()
            p.wait(timeout=20)


#: What the accuracy benchmarks' profiles share unless a profile says otherwise: Fashion-MNIST,
#: one local epoch per round, 6,000 training, 2,000 test and 1,000 evaluation images.
PROFILE = {"dataset": "fashion-mnist", "epochs": 1, "train_samples": 6000, "test_samples": 2000,
           "eval_samples": 1000}
#: Their quick profile (``--quick``: a check that the benchmark runs, not a result).
QUICK = {"clients": 5, "rounds": 4, "train_samples": 1500, "test_samples": 500, "eval_samples": 300,
         "eval_every": 2}


def benchmark_profile(quick: bool, settings: dict, quick_settings: dict | None = None) -> dict:
    """An accuracy benchmark's run settings: :data:`PROFILE` with ``settings`` over it; with
    ``quick``, :data:`QUICK` and then ``quick_settings`` over those."""
    return {**PROFILE, **settings, **({**QUICK, **(quick_settings or {})} if quick else {})}


def fleet_text(base: dict, quick: bool, *, groups: tuple[str, int] | None = None, images: str = "",
               rounds_name: str = "", quick_note: str = "", note: str = "") -> str:
    """The fleet as an accuracy benchmark's page says it, read from its profile ``base`` so that
    the page names the numbers the runs use: ``10 devices (two per tier), 6,000 training images
    (about 600 per device), 40 rounds``. ``groups``: the model family spread evenly over the
    devices (("tier", 5)); ``images``: what the full profile says of its images instead of the
    share per device; ``rounds_name``: the rounds' symbol; then ``quick_note`` or ``note``."""
    clients, train = base["clients"], base["train_samples"]
    devices = f"{clients} devices"
    if groups:
        devices += f" ({['one', 'two', 'three'][clients // groups[1] - 1]} per {groups[0]})"
    images = "" if quick else f" ({images or f'about {train // clients} per device'})"
    rounds = f"{rounds_name} = {base['rounds']}" if rounds_name else base["rounds"]
    sentence = f"{devices}, {train:,} training images{images}, {rounds} rounds"
    return sentence + (quick_note if quick else note)


def decay_rounds(rounds: int) -> tuple[int, ...]:
    """The paper's ×0.1 steps, scaled to the run: at 40 % and 70 % of the rounds (the Felo/Velo
    code's MultiStepLR, as FedDW's benchmark), so the last quarter, where convergence is read,
    comes after both. Devices (and HierarchyFL's server step) follow it."""
    return (round(0.4 * rounds), round(0.7 * rounds))


def fit_exponent(points) -> float | None:
    """b of value ≈ a·N^b: the least-squares slope of log value against log N over ``points``
    ((N, value) pairs; values ≤ 0 are left out); None with fewer than two points."""
    import math

    import numpy as np

    pts = [(math.log(n), math.log(v)) for n, v in points if v > 0]
    if len(pts) < 2:
        return None
    x, y = np.array(pts).T
    return float(np.polyfit(x, y, 1)[0])
