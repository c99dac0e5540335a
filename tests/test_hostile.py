"""Hostile devices, round two (issue 36): every message kind a device sends is held to the
envelope's standard, declared sizes are fixed and every device-supplied weight is bounded."""

import json
import logging
import struct

import numpy as np
import pytest

from edgefl.algorithms.base import DeviceRecord
from edgefl.errors import WireError
from edgefl.models import ModelSpec
from edgefl.runtime.claims import SOURCES, bound_uplinks, label_summary, weight_bound
from edgefl.wire import Envelope, Payload, decode, encode
from edgefl.wire.schema import device_status
from edgefl.wire.validate import parse_active, parse_profile, parse_status
from tests.conftest import tiny_config, wait_until
from tests.needs import need_mosquitto

PROFILE = {
    "name": "d",
    "arch": "x86_64",
    "cpu_model": "cpu",
    "cores": 2,
    "ram_total_mb": 4096,
    "ram_available_mb": 2048,
}


def registry(tmp_path):
    from edgefl.data import dataset_info
    from edgefl.runtime.server import Registry, ServeOptions
    from edgefl.runtime.setup import model_spec

    cfg = tiny_config(tmp_path)
    info = dataset_info(cfg.dataset)
    return Registry(
        cfg,
        lambda tier: model_spec(cfg, tier, info),
        "epoch1",
        0.0,
        ServeOptions(broker="mqtt://127.0.0.1:1"),
    )


def register(device_id="d0", **meta):
    return encode(
        Envelope(
            "register", 0, device_id, payload=Payload({}, {"profile": json.dumps(PROFILE), **meta})
        )
    )


def raw_register(device_id: str, meta: dict) -> bytes:
    """A registration as an attacker writes it: metadata the encoder itself would refuse."""
    from tests.wire_fuzz import _header, write

    header, _ = _header(register(device_id))
    return write({**header["__metadata__"], "meta": json.dumps(meta)}, {})


# --- every message kind, one standard -----------------------------------------------------------


def test_a_registration_with_a_16000_deep_profile_is_refused_and_counted_and_the_registry_goes_on(
    tmp_path, caplog
):
    reg = registry(tmp_path)
    assert reg.handle("d0", register(profile="[" * 16000)) is None
    assert reg.rejected == 1
    assert "device profile nests deeper" in caplog.text
    # it keeps serving
    answer = reg.handle("d0", register(ready=True, num_samples=100, incarnation="a"))
    assert (
        decode(answer).kind == "assign" and reg.ready["d0"].num_samples == 100 and reg.rejected == 1
    )


@pytest.mark.parametrize(
    "meta, reason",
    [
        ({"ready": True}, "must declare num_samples"),
        ({"ready": True, "num_samples": 10**12}, "num_samples"),
        ({"ready": True, "num_samples": 5.5}, "num_samples"),
        ({"ready": "yes", "num_samples": 5}, "ready"),
        ({"profile": json.dumps({"a": [1]})}, "nests 2 deep"),
        ({"profile": json.dumps({f"k{i}": i for i in range(40)})}, "40 profile fields"),
        ({"profile": json.dumps({"a": "x" * 2000})}, "limit 1024"),
        ({"profile": "x" * 20000}, "profile"),
        ({"unknown": 1}, "unknown"),
        ({"tier": "no spaces allowed"}, "tier"),
    ],
)
def test_registrations_out_of_schema_are_refused_with_the_wire_error(
    tmp_path, caplog, meta, reason
):
    reg = registry(tmp_path)
    assert reg.handle("d0", raw_register("d0", {"profile": "{}", **meta})) is None
    assert reg.rejected == 1 and not reg.ready
    assert reason in caplog.text


def test_a_4_mib_deep_header_is_refused_without_a_second_pass():
    deep = b"[" * (4 * 1024 * 1024 - 16)
    data = struct.pack("<Q", len(deep)) + deep
    with pytest.raises(WireError, match="deeper than the parser's recursion limit"):
        decode(data)


def test_status_and_model_reports_are_held_to_a_schema():
    session = "0123456789abcdef"
    assert parse_status(b"online") == ("online", None)  # an earlier version's device
    assert parse_status(b"offline") == ("offline", None)
    assert parse_status(f"online {session}".encode()) == ("online", session)
    assert parse_status(device_status("offline", session)) == ("offline", session)
    for bad in (b"", b"ONLINE", b"online\0", b"x" * 100, b"\xff\xfe", b"online ",
                b"online 0123456789ABCDEF", b"online 0123456789abcde", b"online  0123456789abcdef",
                b"offline 0123456789abcdef0", b"online 0123456789abcdeg"):
        with pytest.raises(WireError):
            parse_status(bad)
    good = {
        "version": "v2",
        "digest": "ab" * 32,
        "tier": "t",
        "format": "int8",
        "previous": ["v1"],
        "time": 1.7e9,
    }
    assert parse_active(json.dumps(good).encode()) == good
    for bad in (
        {"version": "v", "extra": 1},
        {"time": float("nan")},
        {"previous": ["v"] * 100},
        {"format": "zip"},
        [1],
        "[" * 5000,
    ):
        with pytest.raises(WireError):
            parse_active((bad if isinstance(bad, str) else json.dumps(bad)).encode())


def test_profiles_are_flat_and_bounded():
    assert parse_profile(json.dumps(PROFILE)) == PROFILE
    for bad in ("[]", '{"a": {"b": 1}}', '{"a": 1e400}', "nope"):
        with pytest.raises(WireError):
            parse_profile(bad)


# --- declared once, bounded always
# -----------------------------------------------------------------


def test_a_declared_size_is_fixed_within_a_registration_epoch_and_logged_when_a_new_one_changes_it(
    tmp_path, caplog
):
    reg = registry(tmp_path)
    reg.handle("d0", register(ready=True, num_samples=500, incarnation="first"))
    # same epoch: refused
    assert reg.handle("d0", register(ready=True, num_samples=10**9, incarnation="first")) is None
    assert reg.ready["d0"].num_samples == 500 and reg.rejected == 1
    assert (
        "re-declared 1000000000 samples without a new registration epoch (declared 500)"
        in caplog.text
    )
    # no epoch named: not a new one
    assert reg.handle("d0", register(ready=True, num_samples=10**9)) is None
    assert reg.ready["d0"].num_samples == 500 and reg.rejected == 2
    with caplog.at_level(logging.WARNING):
        # a restarted device
        reg.handle("d0", register(ready=True, num_samples=800, incarnation="second"))
    assert reg.ready["d0"].num_samples == 800
    assert "declaring 800 samples, was 500" in caplog.text


def _fleet(sizes):
    spec = ModelSpec("cnn", "2", 10, (1, 28, 28))
    return {f"d{i}": DeviceRecord(spec=spec, num_samples=n) for i, n in enumerate(sizes)}


def test_every_device_supplied_weight_is_clipped_to_the_bound(caplog):
    fleet = _fleet([100, 120, 140, 10**9])
    assert weight_bound(fleet, 10.0) == 10.0 * 130
    ups = {
        "d0": Payload({"count": np.array([50, 50], np.int64)}, {"num_samples": 100}),
        "d3": Payload(
            {"count": np.array([10**9, 3], np.int64), "w": np.ones(2, np.float32)},
            {"num_samples": 10**9},
        ),
    }
    out, clipped = bound_uplinks(4, ups, fleet, 10.0, {"count": "samples"})
    assert out["d0"] is ups["d0"]  # honest: untouched
    assert out["d3"].meta["num_samples"] == 1300
    assert (
        out["d3"].arrays["count"].tolist() == [1300, 3]
        and out["d3"].arrays["count"].dtype == np.int64
    )
    assert clipped == {"d3": {"num_samples": [1e9, 1300.0], "count": [1e9, 1300.0]}}
    assert "device d3 claimed num_samples = 1e+09; clipped to 1300" in caplog.text
    # a per-class count is also held to the device's own declared size; 0 turns the bound off
    small = {"d0": Payload({"count": np.array([90.0, 500.0], np.float32)}, {"num_samples": 100})}
    assert bound_uplinks(0, small, fleet, 10.0, {"count": "samples"})[0]["d0"].arrays[
        "count"
    ].tolist() == [90.0, 100.0]
    assert bound_uplinks(0, ups, fleet, 0.0, {"count": "samples"}) == (ups, {})


def test_counts_over_local_epochs_are_bounded_in_sample_visits():
    """Felo counts a sample each time local training sees it: an honest device that trains 3 epochs
    on a shard of one class claims 3x its declared size for that class, and is not clipped; a claim
    past its own visits is."""
    from edgefl.algorithms import TrainSettings

    fleet = _fleet([100, 120, 140])
    visits = TrainSettings(epochs=3).visits
    honest = {"d0": Payload({"count": np.array([300, 0], np.int64)}, {"num_samples": 100})}
    assert bound_uplinks(0, honest, fleet, 10.0, {"count": "visits"}, visits) == (honest, {})
    lying = {"d0": Payload({"count": np.array([301, 0], np.int64)}, {"num_samples": 100})}
    out, clipped = bound_uplinks(0, lying, fleet, 10.0, {"count": "visits"}, visits)
    assert out["d0"].arrays["count"].tolist() == [300, 0] and clipped == {
        "d0": {"count": [301.0, 300.0]}
    }
    assert TrainSettings(steps=5, batch_size=32).visits(100) == 160


def test_summaries_say_which_figures_are_measured_and_which_are_claimed():
    s = label_summary({"mean_accuracy": 0.5, "bytes_up_per_round": [1], "wall_seconds": 2.0})
    assert s["sources"] == {
        "server_measured": ["bytes_up_per_round", "wall_seconds"],
        "device_reported": ["mean_accuracy"],
    }
    assert s["accuracy_reported_by"] == "devices"
    assert not set(SOURCES["server_measured"]) & set(SOURCES["device_reported"])


# --- no retained uplinks
# ---------------------------------------------------------------------------


def test_deep_messages_over_the_broker_are_refused_counted_and_the_server_keeps_serving(tmp_path):
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    from edgefl.transport.broker import MosquittoBroker
    from edgefl.transport.mqtt import BrokerAddress, MqttServerTransport, Topics

    need_mosquitto()
    topics, reg = Topics("default"), registry(tmp_path)
    with MosquittoBroker(port=0, workdir=tmp_path / "mosq") as broker:
        server = MqttServerTransport(
            BrokerAddress.parse(f"mqtt://127.0.0.1:{broker.port}"),
            "default",
            on_register=reg.handle,
        ).start()
        answers = []
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="d0", protocol=mqtt.MQTTv5)
        c.on_message = lambda cl, u, m: answers.append(decode(m.payload).kind)
        c.connect("127.0.0.1", broker.port)
        c.loop_start()
        try:
            c.subscribe(topics.device("d0", "down"), qos=1)
            deep = b"[" * (4 * 1024 * 1024 - 16)
            c.publish(
                topics.device("d0", "up"), struct.pack("<Q", len(deep)) + deep, qos=1
            ).wait_for_publish(30)
            c.publish(
                topics.device("d0", "register"), register(profile="[" * 16000), qos=1
            ).wait_for_publish(30)
            assert wait_until(lambda: server.stats.rejected.get("d0") == 1 and reg.rejected == 1)
            c.publish(
                topics.device("d0", "register"),
                register(ready=True, num_samples=100, incarnation="a"),
                qos=1,
            )
            assert wait_until(lambda: answers == ["assign"])  # it keeps serving
        finally:
            c.loop_stop()
            c.disconnect()
            server.close()
    assert reg.ready["d0"].num_samples == 100


def test_a_retained_uplink_published_before_the_server_starts_is_ignored(tmp_path, caplog):
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    from edgefl.transport.broker import MosquittoBroker
    from edgefl.transport.mqtt import BrokerAddress, MqttServerTransport, Topics

    need_mosquitto()
    topics = Topics("lab")
    with MosquittoBroker(port=0, workdir=tmp_path / "mosq") as broker:
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="mallory", protocol=mqtt.MQTTv5)
        c.connect("127.0.0.1", broker.port)
        c.loop_start()
        reg = encode(
            Envelope("register", 0, "mallory", fleet="lab", payload=Payload({}, {"profile": "{}"}))
        )
        up = encode(
            Envelope(
                "update", 0, "mallory", fleet="lab", payload=Payload({}, {"num_samples": 10**9})
            )
        )
        for leaf, data in (("register", reg), ("up", up), ("status", b"online")):
            c.publish(topics.device("mallory", leaf), data, qos=1, retain=True).wait_for_publish(10)
        c.loop_stop()
        c.disconnect()
        registrations = []
        server = MqttServerTransport(BrokerAddress.parse(f"mqtt://127.0.0.1:{broker.port}"), "lab",
                                     on_register=lambda d, data: registrations.append(d))
        server.start()
        try:
            assert wait_until(
                lambda: server.retained_ignored == 2 and server.status.get("mallory") == "online"
            )
        finally:
            server.close()
    assert registrations == []  # the retained registration never reached the registry
    assert server.stats.bytes_up == {}
    lines = [r for r in caplog.records if "ignoring retained messages" in r.getMessage()]
    assert len(lines) == 1 and "mallory" in lines[0].getMessage()  # once per device
