"""Federated learning methods, one module each, registered by name on import."""

from edgefl.algorithms import (  # noqa: F401  (registration)
    fedavg,
    feddw,
    fedhenn,
    fedproto,
    fedprox,
    fedrep,
    fedvtc,
    felo,
    hierarchyfl,
    local,
)
from edgefl.algorithms.base import (
    Algorithm,
    DeviceContext,
    DeviceHalf,
    DeviceRecord,
    MethodNeeds,
    ServerContext,
    ServerHalf,
    TrainSettings,
    algorithm_names,
    get_algorithm,
    register,
)
from edgefl.algorithms.server_opt import ServerOptimizer, ServerOptSettings

__all__ = [
    "Algorithm",
    "DeviceContext",
    "DeviceHalf",
    "DeviceRecord",
    "MethodNeeds",
    "ServerContext",
    "ServerHalf",
    "ServerOptSettings",
    "ServerOptimizer",
    "TrainSettings",
    "algorithm_names",
    "get_algorithm",
    "register",
]
