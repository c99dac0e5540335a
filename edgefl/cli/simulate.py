"""``edgefl simulate``: a whole fleet on this machine, in memory."""

from __future__ import annotations

import runpy
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

import typer

from edgefl.cli.common import (
    DATASET_HELP,
    Algorithm,
    DataDir,
    JsonSummary,
    LocalTraining,
    MethodOptions,
    MinFit,
    ModelFamily,
    Rounds,
    RunsDir,
    SecureAggregation,
    ServerAggregation,
    check_run_names,
    option_groups,
    print_export,
    resolve_run,
    run_and_report,
    run_settings,
    split_list,
)
from edgefl.errors import ConfigError
from edgefl.report.console import Feedback, err


def device_entry() -> None:
    """What a forked device process runs: ``edgefl <argv>`` as ``python -m edgefl.cli.main`` runs
    it, the module named, not imported (edgefl.cli.main imports this module: no import circle). The
    fork server has that module loaded already; running it again as ``__main__`` is the intent, and
    runpy's warning about it is filtered in the fork server, whose children inherit the filter
    (:mod:`edgefl.runtime.forkwarm`)."""
    runpy.run_module("edgefl.cli.main", run_name="__main__", alter_sys=True)


def _rounds(value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    if value.strip().lower() in ("", "none"):
        return ()
    try:
        return tuple(int(v) for v in value.split(","))
    except ValueError:
        raise typer.BadParameter(
            f"--lr-decay-rounds {value!r}: give rounds as integers, e.g. 5,8"
        ) from None


@dataclass(frozen=True)
class DifferentialPrivacy:
    """The dp options every method takes (docs/privacy.md), as flags."""

    dp: Annotated[str, typer.Option(
        help="Differential privacy: local (devices noise their uplinks), central (the server "
        "noises the average of clipped updates) or sgd (devices train with DP-SGD, Opacus); "
        "docs/privacy.md.",
    )] = None
    target_epsilon: Annotated[float, typer.Option(
        help="With --dp: each device's privacy budget ε; a device that spent it trains no more.",
    )] = None
    delta: Annotated[
        float, typer.Option(help="With --dp: δ of the (ε, δ) guarantee (default 1e-5).")
    ] = None
    clip: Annotated[float, typer.Option(
        help="With --dp: the clip bound C (an update's L2 norm; a sample's statistics vector's; "
        "under sgd a sample's gradient's). Default 1.",
    )] = None
    noise_multiplier: Annotated[float, typer.Option(
        help="With --dp: noise std / sensitivity (default: the least that keeps the budget over "
        "all rounds).",
    )] = None

    def options(self) -> dict:
        """The method's options given (None: not given)."""
        return {"dp": self.dp} | {f"dp_{k}": v for k, v in asdict(self).items() if k != "dp"}


@dataclass(frozen=True)
class Execution:
    """Where the devices' local work runs: worker processes or Ray actors, torch threads, the
    device (cpu, cuda)."""

    workers: Annotated[int, typer.Option(
        "--workers", "-w",
        help="In memory: train the devices in this many worker processes (0: one per core); "
        "results match the sequential run's.",
    )] = 1
    threads: Annotated[int, typer.Option(
        help="Torch threads per process (with --workers: per worker; default: the cores shared "
        "out).",
    )] = None
    train_device: Annotated[str, typer.Option(
        help="Where the devices train: cpu (default), cuda, cuda:N, or auto (CUDA when torch sees "
        "a GPU).",
    )] = None
    backend: Annotated[str, typer.Option(
        help="In memory: processes (this machine) or ray (Ray actors; --workers of them).",
    )] = "processes"
    ray_address: Annotated[str, typer.Option(
        help="With --backend ray: join this Ray cluster (e.g. 10.0.0.5:6379) instead of starting "
        "one.",
    )] = None

    def settings(self) -> dict:
        """The run settings given (None: not given)."""
        return {"threads": self.threads, "train_device": self.train_device}


@option_groups
def simulate(
    algorithm: Algorithm = None,
    option: MethodOptions = None,
    dataset: str = typer.Option(None, help=DATASET_HELP),
    data_dir: DataDir = None,
    partition: str = typer.Option(None, help="iid, dirichlet or shards."),
    alpha: float = typer.Option(None, help="Dirichlet concentration (> 0)."),
    classes_per_client: int = typer.Option(
        None, "--classes-per-client", "-k", help="Classes per device for shards."
    ),
    clients: int = typer.Option(None, help="Number of devices."),
    fraction: float = typer.Option(None, help="Share of devices sampled each round, in (0, 1]."),
    min_devices: int = typer.Option(
        None, help="Devices that must be ready before the first round (start threshold)."
    ),
    min_fit: MinFit = None,
    rounds: Rounds = None,
    training: LocalTraining = LocalTraining(),
    lr_decay_rounds: str = typer.Option(
        None,
        help="Comma-separated rounds (from 0) at which the lr is multiplied by 0.1 (a "
        "MultiStepLR; 'none' for no decay).",
    ),
    model: ModelFamily = None,
    tiers: str = typer.Option(
        None, help="Comma-separated tiers of the family, assigned round-robin to devices."
    ),
    fleet_file: Path = typer.Option(
        None,
        help="Fleet file (devices/*.yaml): device profiles; each device's tier by the tier policy.",
    ),
    width: float = typer.Option(None, help="Channel width multiplier (CPU-sized runs: 0.25)."),
    feature_dim: int = typer.Option(
        None, help="Common feature dimension (adds a projection where needed)."
    ),
    seed: int = typer.Option(None, help="Seed for partition, models and sampling."),
    train_samples: int = typer.Option(None, help="Subsample the training set for quick runs."),
    test_samples: int = typer.Option(None, help="Subsample the test set for the final evaluation."),
    aggregating: ServerAggregation = ServerAggregation(),
    eval_every: int = typer.Option(
        None, help="Evaluate every N rounds (on --eval-samples test samples)."
    ),
    eval_samples: int = typer.Option(
        None, help="Test samples for the per-round evaluation (the final one uses --test-samples)."
    ),
    out: RunsDir = None,
    run_name: str = typer.Option(
        None, help="Name of the run directory (default: timestamp-algorithm-dataset-seed)."
    ),
    config: Path = typer.Option(None, help="TOML file with any of these settings."),
    as_json: JsonSummary = False,
    quiet: bool = typer.Option(
        False,
        "--quiet",
        "-q",
        help="No progress bars and no line per round: the result and errors only.",
    ),
    transport: str = typer.Option(
        "memory", help="memory, or mqtt: a broker, this process as server, one process per device."
    ),
    execution: Execution = Execution(),
    broker: str = typer.Option(
        None, help="With --transport mqtt: use this broker URL (default: start the embedded one)."
    ),
    compare_local: bool = typer.Option(
        False,
        "--compare-local",
        help="Also report Local (the same devices without federation), run in memory or read from "
        "--reference-cache.",
    ),
    reference_cache: Path = typer.Option(
        None, help="Directory caching reference runs by configuration."
    ),
    export: str = typer.Option(
        None,
        help="Then export every device's final model to RUN/onnx as `edgefl export --run RUN "
        "--all` does (parity-checked, evaluated with ONNX Runtime on the run's test samples): "
        "fp32, or int8 (with a static int8 copy beside each); workers forked from the devices' "
        "fork server.",
    ),
    privacy: DifferentialPrivacy = DifferentialPrivacy(),
    secure: SecureAggregation = SecureAggregation(),
) -> None:
    """Run a whole federated fleet on this machine with the in-memory transport."""
    flags = {
        "algorithm": algorithm,
        "dataset": dataset,
        "data_dir": data_dir,
        "partition": partition,
        "alpha": alpha,
        "classes_per_client": classes_per_client,
        "clients": clients,
        "fraction": fraction,
        "min_devices": min_devices,
        "min_fit": min_fit,
        "rounds": rounds,
        "lr_decay_rounds": _rounds(lr_decay_rounds),
        "model": model,
        "tiers": split_list(tiers),
        "fleet_file": str(fleet_file) if fleet_file else None,
        "width": width,
        "feature_dim": feature_dim,
        "seed": seed,
        "train_samples": train_samples,
        "test_samples": test_samples,
        "eval_every": eval_every,
        "eval_samples": eval_samples,
        "out_dir": str(out) if out else None,
        "run_name": run_name,
    } | training.settings() | aggregating.settings() | execution.settings()
    explicit = run_settings(config, flags, option, privacy.options() | secure.options())
    _fleet_file_clients(explicit)
    check_run_names(explicit)  # names and values, before torch is imported
    if transport not in ("memory", "mqtt"):
        raise ConfigError(f"--transport must be memory or mqtt, got {transport!r}")
    if execution.workers < 0:
        raise ConfigError(f"--workers must be >= 0 (got {execution.workers})")
    if export not in (None, "fp32", "int8"):
        raise ConfigError(f"--export must be fp32 or int8, got {export!r}")
    if transport == "mqtt":  # the devices' fork server imports torch while this process does
        _start_devices_fork_server(explicit)

    cfg, method = resolve_run(explicit)
    _check_names(cfg)
    if export and method.privacy.on_device:
        raise ConfigError(
            "--export: under local differential privacy the devices keep their final models "
            "(none leaves a device un-noised); export them on each device")
    feedback = Feedback(err, rounds=method.total_rounds(cfg.rounds), quiet=quiet)
    if not quiet:
        err.print(_headline(cfg, transport, execution.workers), highlight=False)


    def run() -> dict:
        summary = _run(cfg, method, transport, feedback, broker=broker, execution=execution)
        if compare_local:
            _attach_local(cfg, summary, feedback, reference_cache)
        if export:
            from edgefl.runtime.export_workers import export_all

            summary["export"] = export_all(
                Path(summary["run_dir"]), quantize="int8" if export == "int8" else None,
                test_samples=cfg.test_samples, data_dir=cfg.data_dir,
                on_progress=feedback.progress_hook)
        return summary

    run_and_report(feedback, run, as_json, _print_tiers)


def _start_devices_fork_server(explicit: dict) -> None:
    from edgefl.config import resolve_config
    from edgefl.runtime.processes import start_fork_server

    cfg = resolve_config(explicit)
    start_fork_server([(cfg.dataset, cfg.data_dir)])


def _fleet_file_clients(explicit: dict) -> None:
    """A fleet file names the devices: as many clients as it has (unless --clients says)."""
    if explicit.get("fleet_file") and "clients" not in explicit:
        from edgefl.profiling import load_fleet

        explicit["clients"] = len(load_fleet(explicit["fleet_file"]))


def _check_names(cfg) -> None:
    """Unknown dataset or model family: fail before any progress is drawn."""
    from edgefl.data import dataset_info
    from edgefl.models import family_tiers

    dataset_info(cfg.dataset)
    family_tiers(cfg.model)


def _headline(cfg, transport: str, workers: int) -> str:
    from edgefl.models import family_tiers

    tiers = ", ".join(cfg.tiers or family_tiers(cfg.model))
    processes = f", {workers} worker processes" if transport == "memory" and workers != 1 else ""
    return (f"[bold]{cfg.algorithm}[/] on {cfg.dataset}: {cfg.clients} devices, tiers {tiers}, "
            f"{cfg.rounds} rounds, transport {transport}{processes}")


def _run(
    cfg,
    method,
    transport: str,
    feedback: Feedback,
    *,
    broker,
    execution: Execution,
) -> dict:
    """The run, in memory or over MQTT, with one line per round."""
    total = method.total_rounds(cfg.rounds)

    def on_round(r: dict) -> None:
        feedback.round_done(round_line(r, total))

    if transport == "mqtt":
        from edgefl.runtime.fleet import simulate_mqtt

        return simulate_mqtt(
            cfg,
            broker=broker,
            on_round=on_round,
            on_progress=feedback.progress_hook,
            entry=device_entry,
            say=feedback.line,
            method=method,
        )
    from edgefl.runtime.parallel import default_workers
    from edgefl.runtime.simulation import simulate as run_simulation

    def on_event(name: str, info: dict) -> None:
        if name == "final_evaluation_done" and info.get("failed"):
            feedback.line(
                f"final evaluation: {info['answered']} of {info['devices']} devices answered"
            )

    return run_simulation(
        cfg,
        on_round=on_round,
        workers=execution.workers or default_workers(),
        backend=execution.backend,
        ray_address=execution.ray_address,
        on_progress=feedback.progress_hook,
        on_event=on_event,
        method=method,
    )


def _attach_local(cfg, summary: dict, feedback: Feedback, reference_cache: Path | None) -> None:
    from edgefl.report.recorder import attach_reference
    from edgefl.runtime.reference import local_reference

    feedback.line("Local reference (the same devices without federation)…")
    attach_reference(
        Path(summary["run_dir"]),
        summary,
        "local_reference",
        local_reference(cfg, "local", reference_cache),
    )


def round_line(r: dict, total: int) -> str:
    """One line per round: what a healthy run looks like at a glance."""
    line = f"round {r['round']:>3}/{total}  devices {len(r['completed'])}/{len(r['selected'])}"
    if "eval" in r:
        acc = r["eval"]["mean_accuracy"]
        line += f"  accuracy {100 * acc:5.1f}%" if acc is not None else "  accuracy     -"
    line += (
        f"  up {r['bytes_up_total'] / 1e6:7.3f} MB  down {r['bytes_down_total'] / 1e6:7.3f} MB  "
        f"{r['round_seconds']:5.1f} s"
    )
    if r["failed"]:
        line += f"  [yellow]failed: {', '.join(sorted(r['failed']))}[/]"
    if "privacy" in r:  # ε spent so far, per device
        eps = r["privacy"]["epsilon"]
        line += (
            "\n      ε "
            + "  ".join(f"{d} {e:.2f}" for d, e in eps.items())
            + f"  (target {r['privacy']['target_epsilon']:g})"
        )
    return line


def _print_tiers(summary: dict) -> None:
    """Each tier's accuracy; with a Local reference, beside it, and what the federation adds; the
    exported models (--export)."""
    local = summary.get("local_reference")
    for tier, acc in summary["tier_accuracy"].items():
        ref = local["tier_accuracy"].get(tier) if local else None
        extra = (
            f"   (Local {100 * ref:.2f}%, {100 * (acc - ref):+.2f} points)"
            if ref is not None
            else ""
        )
        err.print(f"  tier {tier}: {100 * acc:.2f}%{extra}", highlight=False)
    if local and summary["mean_accuracy"] is not None:
        err.print(
            f"Local, same devices without federation: {100 * local['mean_accuracy']:.2f}%; "
            "the federation adds "
            f"[bold]{100 * (summary['mean_accuracy'] - local['mean_accuracy']):+.2f} points[/]",
            highlight=False,
        )
    if summary.get("export"):
        for r in summary["export"]:
            print_export(r)
