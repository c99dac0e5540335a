"""What command modules share (so that no command module imports another): the options several
commands take, declared once (the broker, TLS and fleet options, the run's shared options: option
groups, :func:`option_groups`), and small parsing helpers."""

from __future__ import annotations

import functools
import inspect
import json
import typing
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Annotated

import typer

from edgefl.errors import ConfigError
from edgefl.names import ALGORITHMS, DATASETS, MODEL_FAMILIES, listing

# --- options every command that talks to the broker takes -------------------------------------
DEFAULT_BROKER = "mqtt://127.0.0.1:1883"


@dataclass(frozen=True)
class Connection:
    """The broker, fleet and credentials a command was given (an option group)."""

    broker: Annotated[str, typer.Option(
        envvar="EDGEFL_BROKER", help="Broker URL: mqtt[s]://[user:pass@]host[:port]."
    )] = DEFAULT_BROKER
    fleet: Annotated[str, typer.Option(
        envvar="EDGEFL_FLEET", help="Fleet name (topics edgefl/<fleet>/...)."
    )] = "default"
    username: Annotated[str, typer.Option(
        envvar="EDGEFL_USERNAME", help="MQTT username (default: from the URL)."
    )] = None
    password: Annotated[str, typer.Option(
        envvar=["EDGEFL_PASSWORD", "EDGEFL_MQTT_PASSWORD"],
        help="MQTT password (prefer --password-file).",
    )] = None
    password_file: Annotated[Path, typer.Option(
        envvar="EDGEFL_PASSWORD_FILE",
        help="File holding the MQTT password (e.g. systemd's $CREDENTIALS_DIRECTORY/password).",
    )] = None
    ca_file: Annotated[str, typer.Option(
        envvar="EDGEFL_CA_FILE", help="TLS: the fleet CA certificate (mqtts://)."
    )] = None
    cert_file: Annotated[str, typer.Option(
        envvar="EDGEFL_CERT_FILE",
        help="TLS: this client's certificate (edgefl broker add-device --certs).",
    )] = None
    key_file: Annotated[str, typer.Option(
        envvar="EDGEFL_KEY_FILE", help="TLS: this client's private key."
    )] = None

    def address(self):
        """The :class:`~edgefl.transport.mqtt.BrokerAddress` (the password file read: exit 3 if
        unreadable)."""
        return connection_address(
            self.broker,
            self.username,
            self.password,
            self.ca_file,
            self.cert_file,
            self.key_file,
            self.password_file,
        )

    def options(self) -> dict:
        """The connection as the runtime's options take it (``ServeOptions``, ``register_once``):
        broker, fleet, username, password (the password file read: exit 3 if unreadable) and the
        TLS files."""
        values = self.values()
        values["password"] = read_password(values.pop("password"), values.pop("password_file"))
        return values

    def values(self) -> dict:
        return asdict(self)


def option_groups(command):
    """Options declared once, in groups: each parameter of ``command`` whose default is an option
    group (a dataclass whose fields are annotated with their Typer options, e.g. ``conn: Connection
    = Connection()``) stands, to Typer, for the group's options in its place (``--broker --fleet
    --username --password --password-file --ca-file --cert-file --key-file``, with their
    environment variables); the command gets them back as one object of the group's class."""
    signature = inspect.signature(command, eval_str=True)
    params, found = [], {}
    for param in signature.parameters.values():
        if not is_dataclass(param.default):
            params.append(param)
            continue
        group = type(param.default)
        options = typing.get_type_hints(group, include_extras=True)
        found[param.name] = (group, [f.name for f in fields(group)])
        params += [
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=getattr(param.default, name),
                annotation=options[name],
            )
            for name in found[param.name][1]
        ]
    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params]

    @functools.wraps(command)
    def run(**kwargs):
        for name, (group, names) in found.items():
            kwargs[name] = group(**{option: kwargs.pop(option) for option in names})
        return command(**kwargs)

    run.__signature__ = signature.replace(parameters=params)
    run.__annotations__ = {p.name: p.annotation for p in params}
    del run.__wrapped__  # Typer reads the signature above, not the command's
    return run


# --- the run's options that simulate and server start share (option groups) -------------------
@dataclass(frozen=True)
class LocalTraining:
    """How each device trains in a round."""

    epochs: Annotated[int, typer.Option(help="Local epochs per round.")] = None
    steps: Annotated[
        int, typer.Option(help="Local minibatch steps per round (instead of epochs).")
    ] = None
    batch_size: Annotated[int, typer.Option(help="Local batch size.")] = None
    optimizer: Annotated[str, typer.Option(help="sgd or adam.")] = None
    lr: Annotated[float, typer.Option(help="Learning rate.")] = None
    max_grad_norm: Annotated[float, typer.Option(
        help="Scale each local step's gradient down to this L2 norm (default: not clipped).",
    )] = None

    def settings(self) -> dict:
        """The run settings given (None: not given)."""
        return asdict(self)


@dataclass(frozen=True)
class ServerAggregation:
    """How the server aggregates the updates: its optimizer over the averaged weights, and when
    (rounds, or every --buffer updates)."""

    server_opt: Annotated[
        str,
        typer.Option(
            "--server-opt",
            help="Server optimizer over the averaged weights: fedavg (plain averaging), fedavgm, "
            "fedadagrad, fedyogi or fedadam (Reddi et al. 2021).",
        ),
    ] = None
    server_opt_lr: Annotated[
        float,
        typer.Option(
            "--server-opt-lr",
            help="Server learning rate eta (default: the optimizer's, see docs/simulation.md).",
        ),
    ] = None
    server_opt_betas: Annotated[
        str,
        typer.Option(
            "--server-opt-betas",
            help="beta1,beta2 (default 0.9,0.99; FedAvgM's momentum is beta1).",
        ),
    ] = None
    server_opt_eps: Annotated[
        float,
        typer.Option(
            "--server-opt-eps", help="tau, the adaptive optimizers' epsilon (default 1e-3)."
        ),
    ] = None
    aggregation: Annotated[
        str,
        typer.Option(
            "--aggregation",
            help="sync (rounds) or async: aggregate every --buffer updates as they arrive, "
            "staleness-weighted (FedBuff; in memory and over MQTT; docs/simulation.md).",
        ),
    ] = None
    buffer: Annotated[
        int,
        typer.Option(
            "--buffer",
            help="With --aggregation async: updates per aggregation (default: min(10, clients)).",
        ),
    ] = None

    def settings(self) -> dict:
        """The run settings given (None: not given); ``--server-opt-betas`` parsed."""
        return asdict(self) | {"server_opt_betas": parse_betas(self.server_opt_betas)}


@dataclass(frozen=True)
class SecureAggregation:
    """Secure aggregation (SecAgg+): two method options, as flags."""

    secagg: Annotated[
        bool,
        typer.Option(
            "--secagg",
            help="Secure aggregation (SecAgg+; fedavg, fedprox): the server learns only the sum "
            "of the updates (-o secagg=on); docs/privacy.md.",
        ),
    ] = False
    secagg_neighbours: Annotated[
        str,
        typer.Option(
            "--secagg-neighbours",
            help="With --secagg: each device's neighbours in the round's graph (SecAgg+): auto "
            "(the full graph under 50 devices, else k = O(log n)), full, or an even k "
            "(-o secagg_neighbours=K); docs/privacy.md.",
        ),
    ] = None

    def options(self) -> dict:
        """The method's options given (None: not given)."""
        return {
            "secagg": "on" if self.secagg else None,
            "secagg_neighbours": self.secagg_neighbours,
        }


# --- the registries' choices, for --help (edgefl.names: known without importing torch) --------
ALGORITHM_HELP = f"Method: {listing(ALGORITHMS)}; default fedavg."
MODEL_HELP = f"Model family: {listing(MODEL_FAMILIES)} (default: the method's)."
DATASET_HELP = f"Dataset: {listing(d for d in DATASETS if d != 'imagefolder')}, or imagefolder:DIR."

# --- options several commands take, each the same on all of them ----------------------------------
Algorithm = Annotated[str, typer.Option("--algorithm", "-a", help=ALGORITHM_HELP)]
MethodOptions = Annotated[
    list[str], typer.Option("--option", "-o", help="Algorithm option key=value (repeatable).")
]
Rounds = Annotated[int, typer.Option(help="Training rounds.")]
MinFit = Annotated[
    int, typer.Option(help="Fewest devices a round trains (default: what --fraction implies).")
]
DataDir = Annotated[str, typer.Option("--data-dir", help="Directory holding the dataset files.")]
ModelFamily = Annotated[str, typer.Option(help=MODEL_HELP)]
RunsDir = Annotated[Path, typer.Option("--out", help="Output directory for runs (default ./runs).")]
DeviceId = Annotated[
    str,
    typer.Option(
        "--device-id", envvar="EDGEFL_DEVICE_ID", help="This device's id (also its MQTT username)."
    ),
]
Tier = Annotated[
    str, typer.Option(help="Ask for this tier instead of the server's profile-based choice.")
]
MaxBytes = Annotated[int, typer.Option(help="Largest message accepted or sent.")]
MAX_BYTES = 256 * 1024 * 1024
JsonSummary = Annotated[bool, typer.Option("--json", help="Print one JSON summary on stdout.")]


def run_and_report(feedback, run: Callable[[], dict], as_json: bool,
                   details: Callable[[dict], None] | None = None) -> None:
    """A run command's run and its report (``edgefl simulate``, ``edgefl server start``): ``run()``
    inside ``feedback`` (its progress and round lines); Ctrl-C after the record was written
    (:func:`interrupted`, exit 130); then the summary as one JSON line on stdout with ``as_json``,
    else on stderr: the done line (method, result, wall time), ``details``' lines and the run
    directory."""
    from edgefl.errors import RunInterrupted
    from edgefl.report.console import err
    from edgefl.report.recorder import result_text

    try:
        with feedback:
            summary = run()
    except RunInterrupted as e:
        interrupted(e, as_json)
    if as_json:
        typer.echo(json.dumps(summary))
        return
    err.print(
        f"[bold green]done[/] {summary['algorithm']}: {result_text(summary)} in "
        f"{summary['wall_seconds']:.0f} s",
        highlight=False,
    )
    if details is not None:
        details(summary)
    err.print(f"results: {summary['run_dir']}")


def interrupted(e, as_json: bool) -> None:
    """Ctrl-C ended a run after its record was written (RunInterrupted): say what it holds, exit
    130."""
    from rich.console import Console
    from rich.markup import escape

    if as_json:
        typer.echo(json.dumps(e.summary))
    Console(stderr=True).print(
        f"[yellow]{escape(str(e))}[/]", highlight=False
    )  # "interrupted after round …"
    raise typer.Exit(int(e.exit_code))


def read_password(password: str | None, password_file: Path | str | None) -> str | None:
    """The password given, else the first line of ``password_file``; unreadable: exit 3."""
    if password or not password_file:
        return password
    try:
        return Path(password_file).read_text().strip()
    except OSError as e:
        raise ConfigError(
            f"cannot read the password file {password_file} (--password-file): {e.strerror or e}"
        ) from None


def connection_address(
    broker: str,
    username: str | None,
    password: str | None,
    ca_file: str | None,
    cert_file: str | None,
    key_file: str | None,
    password_file: Path | str | None = None,
):
    from edgefl.transport.mqtt import BrokerAddress

    password = read_password(password, password_file)
    return (
        BrokerAddress.parse(broker)
        .with_credentials(username, password)
        .with_tls(ca_file, cert_file, key_file)
    )


def split_list(value: str | None) -> tuple[str, ...] | None:
    """``"a, b"`` → ``("a", "b")``; None stays None."""
    return None if value is None else tuple(v.strip() for v in value.split(",") if v.strip())


def parse_betas(value: str | None) -> tuple[float, float] | None:
    """``--server-opt-betas 0.9,0.99``: two numbers (their ranges are the run configuration's
    check)."""
    if value is None:
        return None
    try:
        b1, b2 = (float(v) for v in value.split(","))
    except ValueError:
        raise typer.BadParameter(
            f"--server-opt-betas {value!r}: give two numbers, e.g. 0.9,0.99"
        ) from None
    return b1, b2


def parse_pairs(items: list[str] | None, what: str) -> dict[str, str]:
    """``["k=v", ...]`` → ``{"k": "v"}`` (``--option``)."""
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{what} {item!r} must look like key=value")
        out[key.strip()] = value.strip()
    return out


def run_settings(
    config: Path | None, flags: dict, option: list[str] | None, options: dict | None = None
) -> dict:
    """A run's explicit settings: the ``--config`` TOML file, the flags given (None: not given) over
    it, and the method's options (``-o key=value``, then ``options`` given, as strings) over its
    own."""
    from edgefl.config import load_toml

    explicit = load_toml(config) if config else {}
    explicit.update({k: v for k, v in flags.items() if v is not None})
    extra = parse_pairs(option, "option") | {
        k: str(v) for k, v in (options or {}).items() if v is not None
    }
    if extra:
        explicit["options"] = {**explicit.get("options", {}), **extra}
    return explicit


def resolve_run(explicit: dict):
    """The :class:`~edgefl.config.RunConfig` of ``explicit`` over the method's defaults, and its
    method (:func:`~edgefl.runtime.method.configure`: the algorithm looked up and its options
    parsed once; ``method.total_rounds(cfg.rounds)`` the rounds it runs in all). Imports torch."""
    from edgefl.runtime.method import configure

    return configure(explicit)


def check_run_names(explicit: dict) -> None:
    """Unknown algorithm, model or dataset names, and invalid values, before torch is imported:
    a mistake is reported at once, not after seconds of imports. (The method's defaults, merged
    later, set no value these checks depend on.)"""
    from edgefl.config import resolve_config
    from edgefl.names import check_algorithm, check_dataset, check_model

    check_algorithm(explicit.get("algorithm", "fedavg"))
    if explicit.get("model") is not None:
        check_model(explicit["model"])
    if explicit.get("dataset") is not None:
        check_dataset(explicit["dataset"])
    resolve_config(explicit)


def load_profile(path: Path | None) -> dict | None:
    if path is None:
        return None
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"cannot read the profile {path}: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"profile {path} is not a JSON object")
    return data


def serve_models(
    address, fleet: str, device_id: str, models_dir: str | None, input_shape: str | None, say
) -> None:
    """Be the device's model agent (``edgefl device agent``, ``edgefl train --models-dir``) until
    stopped."""
    from edgefl.rollout import ModelStore, run_agent
    from edgefl.rollout import models_dir as resolve_models_dir
    from edgefl.runtime.interrupt import leave_within
    from edgefl.transport.broker import check_device_id

    check_device_id(device_id)
    shape = None
    if input_shape:
        try:
            shape = [int(v) for v in input_shape.split(",")]
        except ValueError:
            raise ConfigError(f"--input-shape {input_shape!r}: give C,H,W, e.g. 1,28,28") from None
    store = ModelStore(resolve_models_dir(models_dir), expected_input_shape=shape)
    say(
        f"model agent of {device_id} in fleet {fleet}: {store.dir} (active: "
        f"{(store.active() or {}).get('version')})"
    )
    try:
        # SIGTERM or Ctrl-C: a clean leave (run_agent's finally), within LEAVE_GRACE (a handler
        # that set an Event could wait forever on the lock of that Event's wait in this thread)
        with leave_within():
            run_agent(address, fleet, device_id, store, say=say)
    except KeyboardInterrupt:
        pass


def print_export(r: dict) -> None:
    """One model's export report (``edgefl export``, ``edgefl simulate --export``)."""
    from edgefl.report.console import err

    if r.get("skipped"):
        err.print(f"[yellow]skipped[/] {r['device_id']}: {r['skipped']}", highlight=False)
        return
    who = f"{r['device_id']} " if "device_id" in r else ""
    line = (
        f"[bold green]exported[/] {who}{r['model']} → {r['path']} ({r['size_bytes'] / 1024:.0f} KiB"
    )
    line += f", max |Δ| vs PyTorch {max(map(float, r['parity_max_abs_diff'].values())):.1e}"
    if "accuracy" in r:
        line += f", accuracy {100 * r['accuracy']:.2f}%"
    err.print(line + ")", highlight=False)
    if r["batch_norm"].startswith("frozen"):
        err.print(f"  static BatchNorm {r['batch_norm']}", highlight=False)
    if "int8" in r:
        q = r["int8"]
        line = (
            f"  int8 → {q['path']} ({q['size_bytes'] / 1024:.0f} KiB, {q['size_ratio']:.2f}× the "
            "size"
        )
        if "accuracy" in q and "accuracy" in r:
            line += (
                f", accuracy {100 * q['accuracy']:.2f}% "
                f"({100 * (q['accuracy'] - r['accuracy']):+.2f} points)"
            )
        err.print(line + ")", highlight=False)
