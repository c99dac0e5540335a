"""Local: every device trains alone on its own data; nothing travels. The lower bound."""

from __future__ import annotations

from edgefl.algorithms.base import Algorithm, DeviceHalf, NoOptions, ServerHalf, register
from edgefl.algorithms.fedavg import PAPER_DEFAULTS
from edgefl.algorithms.training import train_round
from edgefl.privacy import Release
from edgefl.wire import Payload


class LocalDevice(DeviceHalf):
    dp_sgd_ready = True  # one train_local per round with cross-entropy (a DP model at the end)

    @classmethod
    def privacy_release(cls, options) -> Release:
        return Release()  # no arrays leave the device

    def fit(self, round: int) -> Payload:
        return Payload({}, train_round(self, round))

    def expected_downlink(self) -> dict:
        return {}  # nothing travels: any array is refused


class LocalServer(ServerHalf):
    """Nothing to aggregate; an uplink carries no arrays at all (anything else is refused)."""

    def expected_uplink(self, device_id: str) -> dict:
        return {}


register(
    Algorithm(
        name="local",
        description="Local training only, no communication (lower bound)",
        device=LocalDevice,
        server=LocalServer,
        options=NoOptions,
        defaults=PAPER_DEFAULTS,  # FedAvg's: the same CNN and recipe, without communication
    )
)
