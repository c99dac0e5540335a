"""The one exception hierarchy of edgefl, and the exit codes of the ``edgefl`` command.

    EdgeflError                      base: the CLI prints its message on one line (exit 1)
    ├── ConfigError                  invalid option values or conflicting settings (exit 3)
    ├── UnknownNameError             a name not in a registry: algorithm, model, dataset … (exit 3)
    ├── DataNotFoundError            dataset files missing; the message says how to get them
    │                                (exit 3)
    ├── MissingExtraError            an optional dependency layer is not installed (exit 7)
    ├── WireError                    a message failed decoding or validation (never fatal to a
    │                                server)
    ├── RunRejectedError             the server refused this device or its request (exit 6)
    ├── ModelFileError               a model file is missing, unreadable or not what it claims to
    │                                be (exit 3)
    ├── RunInterrupted               Ctrl-C ended a run after writing its record (exit 130)
    ├── AllDevicesFailed             a training round in which every selected device failed
    ├── InferenceError               inputs that do not fit an exported model; also a ValueError
    │                                (exit 3)
    └── TransportError               the broker or a peer could not be reached (exit 1)
        ├── BrokerUnreachableError   no broker answered within the time allowed (exit 4)
        └── AuthenticationError      the broker refused the credentials (exit 5)

Exit codes (:class:`ExitCode`) name the cause, so that a service manager or a script can tell
a mistake in the configuration (do not restart) from a broker that is down (retry later).
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Exit status of the ``edgefl`` command, by cause."""

    OK = 0
    ERROR = 1  #: any other edgefl error
    USAGE = 2  #: unknown option, missing argument (click's own convention)
    CONFIG = 3  #: invalid configuration: values, files, names, missing data
    BROKER_UNREACHABLE = 4  #: no broker answered within --wait
    AUTH_REFUSED = 5  #: the broker refused the username/password or certificate
    RUN_REJECTED = 6  #: the server rejected this device or its registration
    MISSING_EXTRA = 7  #: the command needs an install layer that is missing (e.g. [train]: torch)
    INTERRUPTED = 130  #: SIGINT or SIGTERM (128 + SIGINT, the shell's convention)


class EdgeflError(Exception):
    """Base class of every error edgefl raises on purpose."""

    exit_code: ExitCode = ExitCode.ERROR


class ConfigError(EdgeflError, ValueError):
    """An option has an invalid value, or two options conflict."""

    exit_code = ExitCode.CONFIG


def check_fields(data, known, required, what: str) -> None:
    """A record rebuilt from a mapping (a JSON file, a message): a ConfigError naming every field of
    ``data`` that is not ``known``, else every ``required`` one it lacks (``what``: the record)."""
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(f"unknown {what} fields: {', '.join(unknown)}")
    missing = sorted(set(required) - set(data))
    if missing:
        raise ConfigError(f"{what} is missing fields: {', '.join(missing)}")


class UnknownNameError(EdgeflError, KeyError):
    """A name was looked up in a registry that does not hold it."""

    exit_code = ExitCode.CONFIG

    def __init__(self, kind: str, name: str, choices: list[str] | tuple[str, ...]):
        self.kind, self.name, self.choices = kind, name, tuple(choices)
        super().__init__(f"unknown {kind} {name!r}; choose one of: {', '.join(self.choices)}")

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class DataNotFoundError(EdgeflError, FileNotFoundError):
    """Dataset files are missing; the message names where to put them or how to install them."""

    exit_code = ExitCode.CONFIG


#: The distribution's name ("edgefl" on PyPI is an unrelated project).
DISTRIBUTION = "edgefl-toolkit"


def install_hint(extra: str) -> str:
    """How to add an install layer: the same wheel (or repository) again, with the layer."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version(DISTRIBUTION)
    except PackageNotFoundError:  # run from a source tree that was never installed
        installed = "VERSION"
    wheel = f"{DISTRIBUTION.replace('-', '_')}-{installed}-py3-none-any.whl"
    return (
        f"pip install './{wheel}[{extra}]' (the wheel you installed, or the repository: "
        "docs/install-pi-jetson.md)"
    )


class MissingExtraError(EdgeflError):
    """A command needs a module of an install layer (extra) that is not installed."""

    exit_code = ExitCode.MISSING_EXTRA

    def __init__(self, module: str, extra: str, what: str = "this command"):
        self.module, self.extra = module, extra
        super().__init__(
            f"{what} needs {module}, which is part of the [{extra}] install layer: "
            f"{install_hint(extra)}"
        )


class WireError(EdgeflError):
    """A message could not be decoded or failed validation."""


class RunRejectedError(EdgeflError):
    """The server answered, and refused: this device, its tier or its registration."""

    exit_code = ExitCode.RUN_REJECTED


class ModelFileError(EdgeflError):
    """A model file is missing, unreadable, or not what it claims to be."""

    exit_code = ExitCode.CONFIG


class InferenceError(EdgeflError, ValueError):
    """Inputs that the model cannot take (a picture of another size, a missing image file)."""

    exit_code = ExitCode.CONFIG


class RunInterrupted(EdgeflError):
    """Ctrl-C (or SIGTERM) ended a run; what its completed rounds produced is written (exit 130).
    ``summary`` is the run's summary, marked ``interrupted``."""

    exit_code = ExitCode.INTERRUPTED

    def __init__(self, message: str, summary: dict | None = None):
        super().__init__(message)
        self.summary = summary or {}


class AllDevicesFailed(EdgeflError):
    """A training round in which every selected device failed ends the run (a simulation's
    default): ``round`` the round's index from 0 (the message counts from 1, as rounds.jsonl),
    ``failed`` device → why (each device's own error, e.g. a non-finite loss or a spent privacy
    budget); ``hint``: the likely cause where the server can tell (central DP's noise)."""

    def __init__(self, round: int, failed: dict[str, str], hint: str = ""):
        first = next(iter(failed.values()), "unknown")
        super().__init__(f"round {round + 1}: all {len(failed)} devices failed (first: {first})"
                         + (f"; {hint}" if hint else ""))
        self.round, self.failed, self.hint = round, dict(failed), hint


class TransportError(EdgeflError):
    """The transport could not deliver or receive."""


class BrokerUnreachableError(TransportError):
    """No broker accepted a connection within the time allowed."""

    exit_code = ExitCode.BROKER_UNREACHABLE


class AuthenticationError(TransportError):
    """The broker answered and refused the credentials (or is not authorising this client)."""

    exit_code = ExitCode.AUTH_REFUSED


#: Which install layer provides each optional top-level module.
EXTRA_OF_MODULE = {
    "PIL": "images",
    "torch": "train",
    "torchvision": "server",
    "onnx": "server",
    "onnxscript": "server",
    "amqtt": "server",
    "matplotlib": "server",
    "cryptography": "server",
    "aiohttp": "server",
    "dp_accounting": "privacy",
    "opacus": "dp-sgd",
}


def missing_extra(exc: ModuleNotFoundError) -> MissingExtraError | None:
    """The install layer a failed import belongs to, as an error to report; None for a module
    that no extra provides (a genuine bug or a broken install)."""
    root = (exc.name or "").split(".")[0]
    extra = EXTRA_OF_MODULE.get(root)
    return MissingExtraError(root, extra) if extra else None
