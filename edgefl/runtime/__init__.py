"""Runtime: the round loop, the device agent, and the in-memory simulation of a fleet."""

from edgefl.runtime.agent import DeviceAgent
from edgefl.runtime.loop import LoopSettings, RoundLoop

__all__ = ["DeviceAgent", "LoopSettings", "RoundLoop"]
