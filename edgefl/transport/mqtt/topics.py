"""The MQTT topics of a fleet, all under ``edgefl/<fleet>/`` (the table is in
:mod:`edgefl.transport.mqtt`)."""

from __future__ import annotations

from edgefl.errors import ConfigError


class Topics:
    def __init__(self, fleet: str):
        if not fleet or any(c in fleet for c in "+#/"):
            raise ConfigError(f"fleet name {fleet!r} must be non-empty without '+', '#' or '/'")
        self.fleet = fleet
        self.root = f"edgefl/{fleet}"
        self.broadcast = f"{self.root}/broadcast"
        self.server_status = f"{self.root}/server/status"
        # retained; the server and operators read it
        self.fleet_status = f"{self.root}/server/fleet"

    def device(self, device_id: str, leaf: str) -> str:
        return f"{self.root}/devices/{device_id}/{leaf}"

    def parse_device(self, topic: str) -> tuple[str, str] | None:
        """(device id, leaf) of a per-device topic of this fleet, else None."""
        parts = topic.split("/")
        if len(parts) == 5 and parts[:3] == ["edgefl", self.fleet, "devices"]:
            return parts[3], parts[4]
        return None

def _reverse(topic: str) -> str | None:
    """The topic answering ``topic``'s chunks: a device's uplink for its downlink and back."""
    head, _, leaf = topic.rpartition("/")
    return {"up": f"{head}/down", "down": f"{head}/up"}.get(leaf) if head else None
