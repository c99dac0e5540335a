"""The one exception hierarchy of edgefl.

    EdgeflError                      base: the CLI prints its message on one line and exits 1
    ├── ConfigError                  invalid option values or conflicting settings
    ├── UnknownNameError             a name not in a registry (algorithm, model, dataset …)
    ├── DataNotFoundError            dataset files missing; the message says how to get them
    ├── WireError                    a message failed decoding or validation (never fatal to a server)
    └── TransportError               the broker or a peer could not be reached
"""

from __future__ import annotations


class EdgeflError(Exception):
    """Base class of every error edgefl raises on purpose."""


class ConfigError(EdgeflError, ValueError):
    """An option has an invalid value, or two options conflict."""


class UnknownNameError(EdgeflError, KeyError):
    """A name was looked up in a registry that does not hold it."""

    def __init__(self, kind: str, name: str, choices: list[str] | tuple[str, ...]):
        self.kind, self.name, self.choices = kind, name, tuple(choices)
        super().__init__(f"unknown {kind} {name!r}; choose one of: {', '.join(self.choices)}")

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class DataNotFoundError(EdgeflError, FileNotFoundError):
    """Dataset files are missing; the message names where to put them or how to install them."""


class WireError(EdgeflError):
    """A message could not be decoded or failed validation."""


class TransportError(EdgeflError):
    """The transport could not deliver or receive."""
