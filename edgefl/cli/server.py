"""``edgefl server``: the fleet's server process (registration, tiers, the round loop over MQTT)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

import typer

from edgefl.cli.common import (
    DATASET_HELP,
    MAX_BYTES,
    Algorithm,
    Connection,
    DataDir,
    JsonSummary,
    LocalTraining,
    MaxBytes,
    MethodOptions,
    MinFit,
    ModelFamily,
    Rounds,
    RunsDir,
    SecureAggregation,
    ServerAggregation,
    check_run_names,
    option_groups,
    resolve_run,
    run_and_report,
    run_settings,
    split_list,
)
from edgefl.errors import ConfigError
from edgefl.report.console import Feedback, err

app = typer.Typer(help="Run a fleet's server over MQTT.", no_args_is_help=True)


@dataclass(frozen=True)
class RoundPolicy:
    """How the server runs the rounds: how long it waits for the devices, whom it counts, how much
    one device may weigh, where it checkpoints (settings of ``ServeOptions``)."""

    deadline: Annotated[
        float, typer.Option(help="Seconds a round waits for its devices.")
    ] = 120.0
    final_deadline: Annotated[float, typer.Option(
        help="Seconds the final evaluation waits for the devices (default: twice --deadline); who "
        "misses it counts with its last per-round evaluation.",
    )] = None
    test_samples: Annotated[int, typer.Option(
        help="Test samples each device evaluates at the end (default: its whole test split).",
    )] = None
    gone_after: Annotated[float, typer.Option(
        help="Fleet status: seconds without a connection before a device shows as gone (default: "
        "the deadline).",
    )] = None
    max_weight_ratio: Annotated[float, typer.Option(
        min=0.0,
        help="No device's aggregation weight (num_samples, per-class counts) above this × the "
        "fleet's median declared size; 0: off.",
    )] = 10.0
    checkpoint_dir: Annotated[
        Path, typer.Option(help="Checkpoint after every round; resume from here.")
    ] = None

    def options(self) -> dict:
        """The ``ServeOptions`` settings given: a --final-deadline not positive or --test-samples
        below 1 is refused (exit 3)."""
        if self.final_deadline is not None and self.final_deadline <= 0:
            raise ConfigError(f"--final-deadline must be positive (got {self.final_deadline:g})")
        if self.test_samples is not None and self.test_samples < 1:
            raise ConfigError(f"--test-samples must be at least 1 (got {self.test_samples})")
        return asdict(self)


@app.command("start")
@option_groups
def start(
    conn: Connection = Connection(),
    algorithm: Algorithm = None,
    option: MethodOptions = None,
    secure: SecureAggregation = SecureAggregation(),
    rounds: Rounds = None,
    min_devices: int = typer.Option(
        None, help="Ready devices to wait for before the first round (start threshold only)."
    ),
    min_fit: MinFit = None,
    fraction: float = typer.Option(None, help="Share of devices sampled each round."),
    policy: RoundPolicy = RoundPolicy(),
    dataset: str = typer.Option(
        None, help="The task's dataset (input shape, classes; public share). " + DATASET_HELP
    ),
    data_dir: DataDir = None,
    train_samples: int = typer.Option(
        None, help="Training-set subsample the devices' shards come from."
    ),
    model: ModelFamily = None,
    tiers: str = typer.Option(None, help="Comma-separated tiers the policy may assign."),
    width: float = typer.Option(None, help="Channel width multiplier."),
    feature_dim: int = typer.Option(None, help="Common feature dimension."),
    training: LocalTraining = LocalTraining(),
    aggregating: ServerAggregation = ServerAggregation(),
    eval_every: int = typer.Option(None, help="Evaluate every N rounds."),
    seed: int = typer.Option(None, help="Run seed (models, sampling; devices derive theirs)."),
    out: RunsDir = None,
    run_name: str = typer.Option(
        None, help="Run directory name (keep it fixed to resume into it)."
    ),
    config: Path = typer.Option(None, help="TOML file with run settings."),
    wait: float = typer.Option(
        None, help="Give up if min-devices are not ready after this many seconds."
    ),
    broker_wait: float = typer.Option(
        None,
        help="Seconds to wait for an unreachable broker before exiting with code 4 (default: "
        "forever, retried after 1, 2, 4 … 30 s).",
    ),
    max_bytes: MaxBytes = MAX_BYTES,
    metrics_port: int = typer.Option(
        None,
        envvar="EDGEFL_METRICS_PORT",
        help="Serve Prometheus metrics of the fleet on this port (/metrics).",
    ),
    metrics_host: str = typer.Option(
        "127.0.0.1", help="Address the metrics listen on (loopback by default)."
    ),
    as_json: JsonSummary = False,
) -> None:
    """Wait for devices, then run the rounds; devices may join later, late ones are recorded."""
    serving = policy.options()
    flags = {
        "algorithm": algorithm, "rounds": rounds, "min_devices": min_devices, "min_fit": min_fit,
        "fraction": fraction, "dataset": dataset, "data_dir": data_dir,
        "train_samples": train_samples, "model": model,
        "tiers": split_list(tiers), "width": width, "feature_dim": feature_dim,
        "eval_every": eval_every, "seed": seed,
        "out_dir": str(out) if out else None, "run_name": run_name,
    } | training.settings() | aggregating.settings()  # fmt: skip
    explicit = run_settings(config, flags, option, secure.options())
    explicit.setdefault("clients", max(explicit.get("min_devices", 1), explicit.get("min_fit") or 1,
                                       explicit.get("buffer") or 1))
    check_run_names(explicit)  # names and values, before torch is imported
    serving |= conn.options()  # the password file read (exit 3), before waiting for the broker
    _wait_for_broker(conn, broker_wait)

    from edgefl.runtime.server import ServeOptions, serve

    cfg, method = resolve_run(explicit)
    total = method.total_rounds(cfg.rounds)  # dp options included
    opts = ServeOptions(**serving, wait_for_devices=wait, max_bytes=max_bytes,
                        metrics_port=metrics_port, metrics_host=metrics_host)
    feedback = Feedback(err, rounds=total, quiet=as_json)
    _say_metrics(feedback, metrics_host, metrics_port)
    run_and_report(feedback, lambda: serve(
        cfg, opts, on_round=lambda r: feedback.round_done(round_line(r, total)),
        on_progress=feedback.progress_hook, say=feedback.line, method=method,
    ), as_json)


def _wait_for_broker(conn: Connection, broker_wait: float | None) -> None:
    """As ``edgefl train`` does, before torch is imported: say which broker, retry with backoff,
    exit 4 after ``--broker-wait``."""
    from edgefl.retry import Backoff
    from edgefl.runtime.device import wait_for_broker

    wait_for_broker(conn.address(), wait=broker_wait, backoff=Backoff(), option="--broker-wait",
                    say=lambda line: err.print(line, highlight=False, soft_wrap=True))


def _say_metrics(feedback: Feedback, host: str, port: int | None) -> None:
    if port is None:
        return
    feedback.line(f"metrics: http://{host}:{port}/metrics")
    if host not in ("127.0.0.1", "localhost", "::1"):
        err.print(
            "[yellow]warning:[/] the metrics listen beyond loopback and ask for no password "
            "(firewall the port)"
        )


def round_line(r: dict, total: int) -> str:
    """A round's line: devices done, the devices' reported accuracy, who failed."""
    mean = r["eval"]["mean_accuracy"] if "eval" in r else None
    acc = (
        f" acc {100 * mean:.1f}% (device-reported)"
        if mean is not None
        else (" acc -" if "eval" in r else "")
    )
    failed = f", failed: {', '.join(sorted(r['failed']))}" if r["failed"] else ""
    return (
        f"round {r['round']}/{total}: {len(r['completed'])}/{len(r['selected'])} "
        f"devices{acc}{failed}"
    )
