"""Chunked messages over real brokers (embedded amqtt and Mosquitto): round trips both ways, lost
chunks re-sent by progress, hostile chunks refused and counted without displacing the real reply.
(A chunked FedAvg run equal to the in-memory one: tests/test_server_device.py.)"""

import threading
from dataclasses import replace

import numpy as np
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from edgefl.errors import WireError
from edgefl.transport.broker import EmbeddedBroker, MosquittoBroker, mosquitto_binary
from edgefl.transport.chunks import HEADER, MAGIC, ChunkSettings, split
from edgefl.transport.mqtt import BrokerAddress, Topics
from edgefl.wire import Envelope, Payload, decode, encode
from tests.conftest import scaled
from tests.test_mqtt_transport import EchoDevice, started_server

SMALL = ChunkSettings(
    threshold=20_000, chunk_size=8_000, window=4, max_inflight_bytes=40_000, stall_after=0.3
)


def small():
    """SMALL with its stall time stretched by the speed factor (no re-send for a slow ack under
    load)."""
    return replace(SMALL, stall_after=scaled(SMALL.stall_after))
FLOATS = 50_000  # 200 kB: 26 chunks of 8 kB


@pytest.fixture(params=["amqtt", "mosquitto"])
def broker(request, tmp_path):
    if request.param == "mosquitto":
        if mosquitto_binary() is None:
            pytest.skip("mosquitto is not installed")
        b = MosquittoBroker(port=0, workdir=tmp_path / "mosq").start()
    else:
        b = EmbeddedBroker(port=0).start()
    try:
        yield b
    finally:
        b.stop()


def train(fleet, device_id, value, floats=FLOATS):
    return encode(
        Envelope(
            "train",
            0,
            device_id,
            fleet=fleet,
            payload=Payload({"w/x": np.full(floats, value, np.float32)}),
        )
    )


def accept_shape(floats=FLOATS):
    def accept(device_id, data):
        env = decode(data)
        if env.payload.arrays.get("w/x", np.zeros(0)).shape != (floats,):
            raise WireError("w/x has the wrong shape")
        return env

    return accept


def test_large_messages_travel_in_chunks_both_ways_within_the_window_and_budget(broker):
    fleet = "c1"
    server = started_server(broker.url, fleet, retry_after=scaled(0.5), chunks=small())
    devices = [EchoDevice(broker.url, fleet, f"d{i}", chunks=small()).start() for i in range(3)]
    try:
        out = server.request(
            {d.ep.device_id: train(fleet, d.ep.device_id, i) for i, d in enumerate(devices)},
            timeout=scaled(30),
            accept=accept_shape(),
        )
        stats = server.take_stats()
    finally:
        for d in devices:
            d.close()
        server.close()
    for i, d in enumerate(devices):
        assert out[d.ep.device_id].error is None
        assert np.array_equal(
            out[d.ep.device_id].value.payload.arrays["w/x"], np.full(FLOATS, i + 1, np.float32)
        )
        assert (
            d.ep.reassembly.stats.completed == 1
            and d.ep.chunker.stats.messages == 1
            and d.trained == 1
        )
    size = len(train(fleet, "d0", 0))
    sent = server.chunker.stats
    assert sent.messages == 3 and sent.chunks == 3 * -(-size // SMALL.chunk_size)
    assert sent.resent == 0 and not stats.retries  # nothing went twice
    assert 0 < sent.peak_inflight_bytes <= SMALL.max_inflight_bytes
    assert server.reassembly.stats.completed == 3 and server.reassembly.partial_bytes == 0
    # the envelope's bytes, counted once
    assert stats.bytes_down == {d.ep.device_id: size for d in devices}


def test_lost_chunks_are_resent_after_a_stall_and_the_exchange_completes():
    fleet = "c2"
    with EmbeddedBroker(port=0) as broker:
        server = started_server(broker.url, fleet, retry_after=scaled(0.5), chunks=small())
        device = EchoDevice(broker.url, fleet, "d0", chunks=small())
        inner, seen = device.ep._on_message_safe, []

        def lossy(client, userdata, msg):  # the device loses chunks 3 and 7 of the request once
            if msg.payload[:8] == MAGIC:
                index = HEADER.unpack_from(msg.payload)[2]
                if index in (3, 7) and index not in seen:
                    seen.append(index)
                    return
            inner(client, userdata, msg)

        device.ep.client.on_message = lossy
        device.start()
        try:
            out = server.request(
                {"d0": train(fleet, "d0", 1.0)}, timeout=scaled(30), accept=accept_shape()
            )
            stats = server.take_stats()
        finally:
            device.close()
            server.close()
    assert out["d0"].error is None and device.trained == 1
    assert (
        sorted(seen) == [3, 7]
        and server.chunker.stats.resent >= 2
        and server.chunker.stats.stalls >= 1
    )
    assert not stats.retries  # the envelope was not re-sent whole: only its lost chunks


def test_hostile_chunks_are_refused_counted_and_never_displace_the_real_reply(broker):
    fleet = "c3"
    topics = Topics(fleet)
    server = started_server(broker.url, fleet, retry_after=scaled(0.5), chunks=small())
    # the device has the request (it is open), then replies only once the attack is over
    has_request, attacked = threading.Event(), threading.Event()
    device = EchoDevice(
        broker.url,
        fleet,
        "d0",
        chunks=small(),
        before_reply=lambda: (has_request.set(), attacked.wait(scaled(30))),
    ).start()
    attacker = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id="attacker", protocol=mqtt.MQTTv311
    )
    addr = BrokerAddress.parse(broker.url)
    attacker.connect(addr.host, addr.port)
    attacker.loop_start()
    up = topics.device("d0", "up")
    try:
        box = {}
        t = threading.Thread(
            target=lambda: box.update(
                out=server.request(
                    {"d0": train(fleet, "d0", 1.0)}, timeout=scaled(30), accept=accept_shape()
                )
            )
        )
        t.start()
        assert has_request.wait(scaled(30)), "the device never got the request"
        mid = b"\x07" * 16
        hostile = [
            HEADER.pack(MAGIC, mid, 0, 2**32 - 1, 2**63, 1, 0, 0) + b"x",  # a huge count and size
            # data shorter than declared
            HEADER.pack(MAGIC, mid, 0, 3, 24_000, 8_000, 0, 0) + b"x" * 10,
            b"EFLCACK1" + b"junk",  # a malformed chunk ack
        ]
        # whole, well-formed chunked replies that fail the envelope's own checks: another device's
        # name, and an update of the wrong shape for the open request
        reply = Envelope("train", 0, "d0", fleet=fleet).reply
        other = encode(
            Envelope(
                "update",
                0,
                "e9",
                fleet=fleet,
                payload=Payload({"w/x": np.zeros(FLOATS, np.float32)}, {"num_samples": 1}),
            )
        )
        wrong = encode(
            reply("update", Payload({"w/x": np.zeros(FLOATS + 1, np.float32)}, {"num_samples": 1}))
        )
        hostile += split(other, b"\x08" * 16, SMALL.chunk_size) + split(
            wrong, b"\x09" * 16, SMALL.chunk_size
        )
        for data in hostile:
            # (acknowledged: the broker has it)
            attacker.publish(up, data, qos=1).wait_for_publish(scaled(5))
        attacked.set()
        t.join(scaled(40))
        stats = server.take_stats()
    finally:
        attacker.loop_stop()
        attacker.disconnect()
        device.close()
        server.close()
    out = box["out"]["d0"]
    assert out.error is None and np.array_equal(
        out.value.payload.arrays["w/x"], np.full(FLOATS, 2.0, np.float32)
    )
    # refused: the two bad chunks and the ack (chunk layer), the other device's envelope (routing)
    # and the wrong-shaped update (the request's check) — 5, the last one in the exchange's record
    assert stats.rejected["d0"] == 5
    assert len(out.rejected) >= 1 and any("shape" in r for r in out.rejected)
    assert server.reassembly.stats.rejected == 2 and server.chunker.stats.rejected_acks == 1
    assert server.reassembly.partial_bytes == 0


def test_chunk_settings_from_the_environment():
    s = ChunkSettings.from_env(
        {"EDGEFL_CHUNK_THRESHOLD": "1000", "EDGEFL_CHUNK_SIZE": "500", "EDGEFL_CHUNK_WINDOW": "3"}
    )
    assert (s.threshold, s.chunk_size, s.window) == (1000, 500, 3)
    from edgefl.errors import ConfigError

    with pytest.raises(ConfigError):
        ChunkSettings.from_env({"EDGEFL_CHUNK_WINDOW": "many"})
    with pytest.raises(ConfigError):
        ChunkSettings.from_env({"EDGEFL_CHUNK_WINDOW": "1000"})
