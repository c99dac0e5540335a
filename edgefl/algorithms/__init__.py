"""Federated learning methods, one module each, registered by name on import."""

from edgefl.algorithms import fedavg, feddw, fedhenn, fedproto, fedprox, fedvtc, felo, hierarchyfl, local  # noqa: F401  (registration)
from edgefl.algorithms.base import (
    Algorithm,
    DeviceContext,
    DeviceHalf,
    DeviceRecord,
    ServerContext,
    ServerHalf,
    TrainSettings,
    algorithm_names,
    get_algorithm,
    register,
)

__all__ = [
    "Algorithm",
    "DeviceContext",
    "DeviceHalf",
    "DeviceRecord",
    "ServerContext",
    "ServerHalf",
    "TrainSettings",
    "algorithm_names",
    "get_algorithm",
    "register",
]
