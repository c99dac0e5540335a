"""A device that loses its connection while it owes a reply (its Last Will: status "offline")
fails its request at once, on a real Mosquitto: the round ends with the others instead of
waiting for its deadline, and a reply it sends once back is not used; a round whose devices
are all offline waits for the first to come back."""

import socket
import threading
import time

import numpy as np
import pytest

from edgefl.runtime.ending import Availability
from edgefl.transport.broker import MosquittoBroker
from edgefl.transport.mqtt import BrokerAddress, MqttDeviceEndpoint
from edgefl.transport.mqtt.device import _leaving
from edgefl.wire import Envelope, Payload, decode, encode
from tests.conftest import scaled, wait_until
from tests.test_mqtt_transport import EchoDevice, started_server

DEADLINE = 120.0  # the round's deadline: far beyond what either test waits for


@pytest.fixture(scope="module")
def mosquitto(tmp_path_factory):
    broker = MosquittoBroker(port=0, workdir=tmp_path_factory.mktemp("mosquitto")).start()
    try:
        yield broker
    finally:
        broker.stop()


def dropper(url, fleet, device_id):
    """A device that loses its connection (the socket shut, no DISCONNECT: the broker publishes
    its Last Will) when its first request arrives, and replies once connected again."""
    dropped = threading.Event()

    def drop():
        if not dropped.is_set():
            device.ep.connected.clear()
            device.ep.client.socket().shutdown(socket.SHUT_RDWR)  # Wi-Fi gone
            dropped.set()
            wait_until(device.ep.connected.is_set, "the device reconnecting", timeout=60)

    device = EchoDevice(url, fleet, device_id, before_reply=drop)
    device.dropped = dropped
    return device


def _train(fleet, device_id, rnd):
    return encode(
        Envelope("train", rnd, device_id, fleet=fleet, payload=Payload({"w/x": np.ones(4, "f4")}))
    )


def test_a_device_that_goes_offline_mid_round_fails_at_once_and_its_late_reply_is_not_used(
    mosquitto,
):
    fleet = "off1"
    server = started_server(mosquitto.url, fleet, retry_after=scaled(0.5))

    # the steady device replies only once the dropper's reply (sent after it came back) has
    # reached the server: the exchange is still open then, and that reply must not be taken
    def late_reply_seen():
        wait_until(lambda: "dropper:update:0" in server.stats.dropped, "the late reply", 60)

    steady = EchoDevice(mosquitto.url, fleet, "steady", before_reply=late_reply_seen).start()
    dropping = dropper(mosquitto.url, fleet, "dropper").start()
    try:
        t0 = time.monotonic()
        out = server.request(
            {d: _train(fleet, d, 0) for d in ("steady", "dropper")},
            timeout=scaled(DEADLINE),
            accept=lambda device_id, data: decode(data),
        )
        took = time.monotonic() - t0
    finally:
        steady.close()
        dropping.close()
        server.close()
    assert dropping.dropped.is_set() and dropping.trained == 1
    assert out["dropper"].reply is None
    assert "device went offline" in out["dropper"].error
    assert "Last Will" in out["dropper"].error
    assert decode(out["steady"].reply).payload.arrays["w/x"].tolist() == [2.0] * 4
    # the round ended with the steady device, not at the deadline the dropper would have held it to
    assert took < scaled(DEADLINE) / 2


def test_an_open_request_whose_device_goes_offline_arrives_failed(mosquitto):
    # asynchronous aggregation keeps requests open across calls: arrivals() returns it failed
    fleet = "off2"
    server = started_server(mosquitto.url, fleet, retry_after=scaled(0.5))
    dropping = dropper(mosquitto.url, fleet, "dropper").start()
    try:
        assert server.submit({"dropper": _train(fleet, "dropper", 3)}, accept=None) == {}
        got = server.arrivals(["dropper"], most=1, timeout=scaled(DEADLINE))
        wait_until(lambda: "dropper:update:3" in server.stats.dropped, "the late reply", 60)
        still_open = "dropper" in server.pending
    finally:
        dropping.close()
        server.close()
    assert list(got) == ["dropper"] and got["dropper"].reply is None
    assert "device went offline" in got["dropper"].error
    assert not still_open  # closed when it failed: the reply after it was not used


def test_a_round_of_nobody_waits_for_the_first_device_to_come_back():
    # every device offline by its Last Will: the round waits for one (as the fleet clock does)
    # instead of running empty; with nobody back by the deadline it goes on
    status = {"a": "offline", "b": "offline"}
    available = Availability(status, dict.fromkeys(status, time.time()))
    assert available.wait_for_any(["a", "b"], timeout=0.05) is False
    got = {}
    waiter = threading.Thread(
        target=lambda: got.update(back=available.wait_for_any(["a", "b"], scaled(DEADLINE)))
    )
    waiter.start()
    status["b"] = "online"  # its client reconnected: "online" on its status topic
    waiter.join(scaled(DEADLINE))
    assert got == {"back": True}
    assert available.wait_for_any(["a", "b"], timeout=0.0) is True  # someone is online: no wait


def test_a_reply_is_not_re_sent_while_its_last_copy_has_not_left_the_device(mosquitto):
    # a slow uplink, or a connection that is down: paho still holds the copy and will deliver
    # it; a re-sent copy would only queue behind it (on a 0.1 Mbit/s link, 9 s per 114 kB)
    from edgefl.wire.validate import peek

    fleet = "off3"
    request = peek(_train(fleet, "d", 0))
    reply = encode(
        decode(_train(fleet, "d", 0)).reply("update", Payload({}, {"num_samples": 1}))
    )
    ep = MqttDeviceEndpoint(BrokerAddress.parse(mosquitto.url), fleet, "d", retry_after=0.05)
    sent = []
    publish = ep.client.publish

    def counting(topic, data, **kw):
        if topic.endswith("/up"):
            sent.append(topic)
        return publish(topic, data, **kw)

    ep.client.publish = counting
    ep.start()
    try:
        ep.client.loop_stop()  # paho's network thread holds: nothing leaves the device
        ep.reply(request, reply)
        (u,) = ep.unacked.values()
        wait_until(lambda: time.monotonic() > u.next_retry, "the re-send to fall due", 60)
        ep.retry_unacked()
        held = (len(sent), u.sending.is_published())
        ep.client.loop_start()  # the copy leaves; the broker has it, nobody acknowledges it
        wait_until(u.sending.is_published, "the broker's PUBACK", 60)
        wait_until(lambda: time.monotonic() > u.next_retry, "the re-send to fall due", 60)
        ep.retry_unacked()
        resent = len(sent)
        # published while the connection is down: paho queues it (NO_CONN) and sends it once
        # connected again; meanwhile it is not re-sent, and asking paho about it does not fail
        ep.client.disconnect()
        ep.client.loop_stop()
        ep.reply(peek(_train(fleet, "d", 1)), reply)
        down = next(u for u in ep.unacked.values() if u.request[1] == 1)
        wait_until(lambda: time.monotonic() > down.next_retry, "the re-send to fall due", 60)
        ep.retry_unacked()
        queued = len(sent)
        ep.client.reconnect()
        ep.client.loop_start()
        wait_until(lambda: not _leaving(down.sending), "the queued copy to reach the broker", 60)
    finally:
        ep.stop(graceful=False)
    assert held == (1, False)  # still in paho: not re-sent
    assert resent == 2  # with the broker and unacknowledged: re-sent
    assert queued == 3  # the reply published while disconnected: once, not re-sent
