"""The server's closing broadcasts, held back for the next request (edgefl.transport.mqtt.closing),
without a broker."""

import threading

from edgefl.transport.mqtt.closing import DeferredCloses
from tests.conftest import scaled, wait_until


class Announced:
    def __init__(self):
        self.calls, self.lock = [], threading.Lock()

    def __call__(self, kind, rnd):
        with self.lock:
            self.calls.append((kind, rnd))


def test_an_exchange_whose_devices_all_got_a_new_request_is_never_announced():
    announced = Announced()
    closes = DeferredCloses(announced, scaled(0.2), "test-close")
    closes.close("train", 0, ["a", "b"])
    closes.requested("a")
    closes.requested("b")
    closes.close("train", 1, ["a", "b"])
    closes.requested("a")  # b gets no new request: round 1 is announced, after the delay
    assert announced.calls == []
    wait_until(lambda: announced.calls, "round 1's close announced")
    closes.stop()
    assert announced.calls == [("train", 1)]


def test_flush_announces_what_waits_and_no_delay_announces_at_once():
    announced = Announced()
    closes = DeferredCloses(announced, 3600.0, "test-close")
    closes.close("train", 4, ["a"])
    closes.close("evaluate", 4, ["a", "b"])
    closes.close("finish", 5, [])  # nobody to acknowledge
    closes.flush()
    assert announced.calls == [("evaluate", 4), ("train", 4)]
    closes.stop()
    closes.close("finish", 5, ["a"])  # stopped: at once
    assert announced.calls[-1] == ("finish", 5)
    now = Announced()
    DeferredCloses(now, 0.0, "test-close").close("train", 9, ["a"])
    assert now.calls == [("train", 9)]
