"""Transports: in-memory (simulation) and MQTT (deployment)."""

from edgefl.transport.base import Delivery, Encoded, Transport, WireTransport
from edgefl.transport.memory import InMemoryTransport

__all__ = ["Delivery", "Encoded", "InMemoryTransport", "Transport", "WireTransport"]
