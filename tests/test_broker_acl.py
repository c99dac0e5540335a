"""Mosquitto with the shipped ACL scheme: a device writes only under its own id; passwords count."""

import os
import threading
import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from edgefl.errors import TransportError
from edgefl.transport.accounts import add_user
from edgefl.transport.broker import MosquittoBroker, mosquitto_binary
from edgefl.transport.mqtt import BrokerAddress, MqttDeviceEndpoint
from edgefl.transport.mqtt.connection import _PROTOCOL_CACHE
from tests.conftest import scaled, wait_until
from tests.needs import need_mosquitto


@pytest.fixture
def secured(tmp_path):
    need_mosquitto()
    passwd, acl = tmp_path / "passwd", tmp_path / "acl"
    secrets = {
        "edgefl-server": add_user(passwd, acl, "edgefl-server", fleet="lab", role="server"),
        "dev-a": add_user(passwd, acl, "dev-a", fleet="lab"),
        "dev-b": add_user(passwd, acl, "dev-b", fleet="lab"),
    }
    with MosquittoBroker(
        port=0, password_file=passwd, acl_file=acl, workdir=tmp_path / "mosq"
    ) as broker:
        yield broker, secrets


def client(broker, user, password, received=None, subscribe=()):
    c = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=f"t-{user}-{time.monotonic_ns()}",
        protocol=mqtt.MQTTv5,
    )
    c.username_pw_set(user, password)
    state = {
        "connected": threading.Event(),
        "reason": None,
        "subscribed": threading.Event(),
        "acks": 0,
    }

    def on_subscribe(cl, userdata, mid, reasons, props):
        state["acks"] += 1
        if state["acks"] == len(subscribe):
            state["subscribed"].set()

    def on_connect(cl, userdata, flags, reason, props):
        state["reason"] = reason
        for t in subscribe:
            cl.subscribe(t, qos=1)
        state["connected"].set()

    c.on_connect = on_connect
    c.on_subscribe = on_subscribe
    if received is not None:
        c.on_message = lambda cl, u, m: received.append((m.topic, m.payload))
    c.connect("127.0.0.1", broker.port)
    c.loop_start()
    state["connected"].wait(scaled(10))
    return c, state


def test_a_device_cannot_publish_or_read_as_another_device(secured):
    broker, secrets = secured
    got_server, got_a = [], []
    server, s_state = client(
        broker, "edgefl-server", secrets["edgefl-server"], got_server, ["edgefl/lab/devices/+/up"]
    )
    a, a_state = client(
        broker,
        "dev-a",
        secrets["dev-a"],
        got_a,
        ["edgefl/lab/devices/dev-b/down", "edgefl/lab/devices/dev-a/down"],
    )
    assert s_state["subscribed"].wait(scaled(10)) and a_state["subscribed"].wait(scaled(10))
    a.publish("edgefl/lab/devices/dev-b/up", b"forged", qos=1).wait_for_publish(scaled(5))
    a.publish("edgefl/lab/devices/dev-a/up", b"own", qos=1).wait_for_publish(scaled(5))
    server.publish("edgefl/lab/devices/dev-b/down", b"for b", qos=1).wait_for_publish(scaled(5))
    server.publish("edgefl/lab/devices/dev-a/down", b"for a", qos=1).wait_for_publish(scaled(5))
    # the allowed messages went after the forbidden ones from the same client: once they are in,
    # a forbidden one that got through would be in too
    wait_until(
        lambda: (
            ("edgefl/lab/devices/dev-a/up", b"own") in got_server
            and ("edgefl/lab/devices/dev-a/down", b"for a") in got_a
        ),
        "the allowed messages",
        timeout=30,
    )
    for c in (server, a):
        c.loop_stop()
        c.disconnect()
    # the forged message never arrived
    assert got_server == [("edgefl/lab/devices/dev-a/up", b"own")]
    # and B's downlink is not readable
    assert got_a == [("edgefl/lab/devices/dev-a/down", b"for a")]


def test_a_wrong_password_is_refused(secured):
    broker, secrets = secured
    c, state = client(broker, "dev-a", "not-the-password")
    c.loop_stop()
    assert state["reason"] is not None and state["reason"].is_failure
    assert "password" in str(state["reason"]).lower() or "authori" in str(state["reason"]).lower()
    _PROTOCOL_CACHE.clear()
    with pytest.raises(TransportError, match="refused"):
        MqttDeviceEndpoint(
            BrokerAddress.parse(f"mqtt://dev-a:wrong@127.0.0.1:{broker.port}"), "lab", "dev-a"
        )


def test_mqtt5_with_mosquitto_and_3_1_1_with_the_embedded_broker(tmp_path):
    from edgefl.transport.broker import EmbeddedBroker
    from edgefl.transport.mqtt import detect_protocol

    if mosquitto_binary() is None and os.environ.get("CI") != "true":
        pytest.skip("mosquitto is not installed")
    with MosquittoBroker(port=0, workdir=tmp_path / "m") as m, EmbeddedBroker(port=0) as e:
        assert detect_protocol(BrokerAddress.parse(m.url)) == mqtt.MQTTv5
        assert detect_protocol(BrokerAddress.parse(e.url)) == mqtt.MQTTv311
