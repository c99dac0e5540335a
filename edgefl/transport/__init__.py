"""Transports: in-memory (simulation) and MQTT (deployment)."""

from edgefl.transport.base import Delivery, Transport
from edgefl.transport.memory import InMemoryTransport

__all__ = ["Delivery", "InMemoryTransport", "Transport"]
