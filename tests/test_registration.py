"""A device's registration retries back off: a fleet waiting for a busy or absent server does not
re-register every few seconds in step (the 1,000-device fleet's registration storm)."""

import threading

import pytest

from edgefl.runtime import device as device_module
from edgefl.runtime.device import DeviceOptions, DeviceRuntime
from edgefl.runtime.fleet import SIMULATED_PROFILE


class Endpoint:
    """No broker: records what the device would publish."""

    def __init__(self, *args, **kwargs):
        self.sent = []
        self.connected = threading.Event()

    def send(self, kind, data):
        self.sent.append(kind)


@pytest.fixture(autouse=True)
def no_broker(monkeypatch):
    monkeypatch.setattr(device_module, "MqttDeviceEndpoint", Endpoint)


def runtime(device_id: str, **options) -> DeviceRuntime:
    rt = DeviceRuntime(
        DeviceOptions(
            broker="mqtt://127.0.0.1:9",
            device_id=device_id,
            data="fashion-mnist",
            profile=dict(SIMULATED_PROFILE),
            **options,
        )
    )
    rt.sent = rt.endpoint.sent
    return rt


def test_unanswered_registrations_back_off_doubling_with_jitter_up_to_the_cap(monkeypatch):
    rt = runtime("d0", register_every=3.0, register_cap=60.0)
    now = [1000.0]
    monkeypatch.setattr("edgefl.runtime.device.time.monotonic", lambda: now[0])
    delays = []
    for _ in range(8):
        rt._register()
        delays.append(rt.next_register - now[0])
    assert rt.sent == ["register"] * 8
    expected = [3, 6, 12, 24, 48, 60, 60, 60]
    for got, base in zip(delays, expected, strict=True):
        assert 0.75 * base <= got <= 1.25 * base, (delays, expected)
    assert delays[4] > delays[0] * 8  # it really grows (48 ± 25 % against 3 ± 25 %)


def test_devices_spread_their_retries_apart():
    firsts = {round(runtime(f"d{i}").register_delay(3), 3) for i in range(20)}
    assert len(firsts) == 20  # twenty devices, twenty different retry times
    assert all(0.75 * 24 <= f <= 1.25 * 24 for f in firsts)


def test_a_server_that_answers_or_restarts_starts_the_retries_over(monkeypatch):
    rt = runtime("d1", register_every=2.0)
    now = [50.0]
    monkeypatch.setattr("edgefl.runtime.device.time.monotonic", lambda: now[0])
    for _ in range(4):
        rt._register()
    assert rt.unanswered == 4 and rt.next_register - now[0] >= 0.75 * 16
    # a new server: register at once, from the start
    rt._on_server({"state": "online", "epoch": "e2"})
    assert rt.unanswered == 0 and rt.next_register == 0.0
    rt.endpoint.connected.set()
    rt.register_if_due()
    assert rt.sent[-1] == "register" and rt.next_register - now[0] <= 1.25 * 2.0
