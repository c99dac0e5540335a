"""``edgefl train``: run this machine as one device of a fleet until the server ends the run.

Built to run as a service (``deploy/edgefl-device.service``): it says at once which broker it is
waiting for, retries with capped exponential backoff (``--wait`` bounds the wait; default:
forever), rides out broker restarts, and prints one line per round. Settings come from options,
then environment variables, then a TOML file (``--config``, or ``EDGEFL_CONFIG``)::

    broker = "mqtt://broker.lan:1883"      # EDGEFL_BROKER
    fleet = "lab"                           # EDGEFL_FLEET
    device_id = "pi-07"                     # EDGEFL_DEVICE_ID
    username = "pi-07"                      # EDGEFL_USERNAME
    password_file = "/etc/edgefl/password"  # EDGEFL_PASSWORD_FILE
                                            # (or the password: EDGEFL_PASSWORD)
    data = "imagefolder:/var/lib/edgefl/data"

``--print-config`` shows the result and where each value came from. Exit codes:
:class:`edgefl.errors.ExitCode`.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import typer

from edgefl.cli.common import (
    DATASET_HELP,
    MAX_BYTES,
    Connection,
    DeviceId,
    MaxBytes,
    Tier,
    connection_address,
    load_profile,
    option_groups,
    serve_models,
)
from edgefl.errors import ConfigError
from edgefl.names import check_dataset
from edgefl.report.console import Feedback, out

#: Settings a TOML file may hold, and the option each one sets.
FILE_KEYS = (
    "broker", "fleet", "device_id", "username", "password", "password_file", "data", "tier",
    "profile", "delay", "max_bytes", "threads", "train_device", "save_model", "export", "wait",
    "ca_file", "cert_file", "key_file", "models_dir",
)  # fmt: skip
SECRET = "password"


def read_config_file(path: Path) -> dict[str, Any]:
    from edgefl.config import tomllib

    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"cannot read the configuration file {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"configuration file {path} is not valid TOML: {e}") from None
    data = data.get("device", data)  # a [device] table, or the keys at the top level
    unknown = sorted(set(data) - set(FILE_KEYS))
    if unknown:
        raise ConfigError(
            f"configuration file {path}: unknown keys {', '.join(unknown)}; known: "
            f"{', '.join(FILE_KEYS)}"
        )
    return {key.replace("-", "_"): value for key, value in data.items()}


#: Settings a run cannot do without: the option, its environment variable, its key in the file.
REQUIRED = {"device_id": ("--device-id", "EDGEFL_DEVICE_ID"), "data": ("--data", None)}


def merge(
    values: dict[str, Any], sources: dict[str, str], config: Path | None
) -> tuple[dict[str, Any], dict[str, str]]:
    """Options > environment > file > defaults. ``sources`` says where each value came from
    ("option", "env", "default"); file values fill those that came from defaults."""
    resolved, origin = dict(values), dict(sources)
    if config is not None:
        for key, value in read_config_file(config).items():
            if origin.get(key, "default") == "default":
                resolved[key], origin[key] = value, f"file {config}"
    if resolved.get("password_file") and not resolved.get("password"):
        try:
            resolved["password"] = Path(resolved["password_file"]).read_text().strip()
        except OSError as e:
            raise ConfigError(
                f"cannot read the password file {resolved['password_file']}: {e.strerror or e}"
            ) from None
        origin["password"] = f"password file {resolved['password_file']}"
    return resolved, origin


def require(resolved: dict[str, Any]) -> None:
    """Exit 3 naming each required setting that is missing, and every way to give it."""
    missing = []
    for key, (option, env) in REQUIRED.items():
        if not resolved.get(key):
            missing.append(
                f"{option} (or {env}, or {key} = ... in the --config file)"
                if env
                else f"{option} (or {key} = ... in the --config file)"
            )
    if missing:
        raise ConfigError(f"edgefl train needs {' and '.join(missing)}")


def resolve(
    values: dict[str, Any], sources: dict[str, str], config: Path | None
) -> tuple[dict[str, Any], dict[str, str]]:
    resolved, origin = merge(values, sources, config)
    require(resolved)
    return resolved, origin


def _without_password(url: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(url if "://" in url else f"mqtt://{url}")
    if parts.password is None:
        return url
    return parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")).geturl()


def _source(ctx: typer.Context, name: str) -> str:
    source = ctx.get_parameter_source(name)
    kind = getattr(source, "name", "DEFAULT")
    return {"COMMANDLINE": "option", "ENVIRONMENT": "env"}.get(kind, "default")


@option_groups
def train(
    ctx: typer.Context,
    conn: Connection = Connection(),
    device_id: DeviceId = None,
    data: str = typer.Option(
        None,
        help="DATASET[:shard=I/N,partition=dirichlet,alpha=0.5,seed=0,train_samples=...]. "
        + DATASET_HELP,
    ),
    tier: Tier = None,
    profile: Path = typer.Option(
        None, help="Profile JSON (edgefl device profile --json); default: measure this machine."
    ),
    config: Path = typer.Option(
        None,
        envvar="EDGEFL_CONFIG",
        help="TOML file of settings (options and environment variables win over it).",
    ),
    wait: float = typer.Option(
        None,
        help="Seconds to wait for an unreachable broker before exiting with code 4 (default: "
        "forever).",
    ),
    print_config: bool = typer.Option(
        False,
        "--print-config",
        help="Print the resolved settings and where each came from, then exit.",
    ),
    delay: float = typer.Option(
        0.0, help="Extra seconds per training round (emulate a slow device)."
    ),
    max_bytes: MaxBytes = MAX_BYTES,
    threads: int = typer.Option(None, help="Torch CPU threads."),
    train_device: str = typer.Option(
        None,
        help="Where local training runs: auto (a CUDA GPU when this torch build sees one, else "
        "the CPU), cpu, cuda or cuda:N. Default: auto.",
    ),
    save_model: Path = typer.Option(
        None, help="When the run is over, save the final model here (.safetensors)."
    ),
    export: Path = typer.Option(
        None, help="When the run is over, export the final model to this ONNX file."
    ),
    models_dir: str = typer.Option(
        None,
        help="When the run is over, stay as the model agent (edgefl device agent) with this store.",
    ),
) -> None:
    """Serve rounds for a fleet's server: one line per round (round, tier, local loss, last local
    accuracy, bytes up/down, seconds); waits for the broker and reconnects by itself; exits when
    the run is over."""
    values = conn.values() | {
        "device_id": device_id, "data": data, "tier": tier, "profile": profile, "wait": wait,
        "delay": delay, "max_bytes": max_bytes, "threads": threads, "train_device": train_device,
        "save_model": save_model, "export": export,
        "models_dir": models_dir,
    }  # fmt: skip
    sources = {key: _source(ctx, key) for key in values}
    if print_config:
        resolved, origin = merge(values, sources, config)
        for key in sorted(resolved):
            shown = "***" if key == SECRET and resolved[key] else resolved[key]
            plain = shown is None or isinstance(shown, int | float | bool)
            typer.echo(
                f"{key} = {json.dumps(shown if plain else str(shown))}  "
                f"# {origin.get(key, 'default')}"
            )
        require(resolved)  # shown what there is; a missing setting fails as the run would (exit 3)
        return
    resolved, _ = resolve(values, sources, config)
    check_dataset(
        str(resolved["data"])
    )  # an unknown dataset fails here, before the broker and torch

    feedback = Feedback(out, what="rounds trained")
    served_rounds = re.compile(r"registered with server .*, (\d+) rounds$")

    def say(line: str) -> None:
        if not feedback.bars:
            typer.echo(f"[{resolved['device_id']}] {line}")
            sys.stdout.flush()  # journald and pipes see each line as it happens
            return
        feedback.line(f"[{resolved['device_id']}] {line}", markup=False)
        if (m := served_rounds.match(line)) is not None:  # a terminal: a bar of the run's rounds
            feedback.start_rounds(int(m.group(1)))
        elif line.startswith("round ") and " | loss " in line:
            feedback.round_done()

    wait_s = resolved["wait"]
    # said before the runtime (paho, numpy) is imported: a service's first line comes at once
    say(
        f"waiting for broker {_without_password(str(resolved['broker']))} "
        f"({'no time limit' if wait_s is None else 'up to ' + format(float(wait_s), 'g') + ' s'})"
    )
    from edgefl.runtime.device import DeviceOptions, run_device

    opts = DeviceOptions(
        broker=str(resolved["broker"]),
        device_id=str(resolved["device_id"]),
        data=str(resolved["data"]),
        fleet=str(resolved["fleet"]),
        tier=resolved["tier"],
        profile=load_profile(resolved["profile"]),
        username=resolved["username"],
        password=resolved["password"],
        ca_file=resolved["ca_file"],
        cert_file=resolved["cert_file"],
        key_file=resolved["key_file"],
        delay=float(resolved["delay"]),
        max_bytes=int(resolved["max_bytes"]),
        threads=resolved["threads"],
        train_device=str(resolved["train_device"] or "auto"),
        save_model=str(resolved["save_model"]) if resolved["save_model"] else None,
        export=str(resolved["export"]) if resolved["export"] else None,
        wait=None if wait_s is None else float(wait_s),
        say=say,
        announced=True,
    )
    from edgefl.runtime.interrupt import leave_within

    with feedback, leave_within():  # SIGTERM: leave the broker cleanly, and exit within 8 s
        served = run_device(opts)
    say(f"done: served {served} requests")
    if resolved[
        "models_dir"
    ]:  # the run is over: receive the deployed model (edgefl deploy) until stopped
        address = connection_address(
            opts.broker, opts.username, opts.password, opts.ca_file, opts.cert_file, opts.key_file
        )
        serve_models(address, opts.fleet, opts.device_id, resolved["models_dir"], None, say)
