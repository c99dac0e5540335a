"""Live injection (issue 19): an attacker holding device d00's broker credentials injects the
issue's messages into a running fleet (server + 3 device processes over Mosquitto) while it
trains FedAvg. The run must finish with every round's real updates, a finite model, the replay
and the algorithm mismatch refused, and no round waiting out its deadline.

The attacker reads d00's downlinks (as d00 may) and, for each train request, at once publishes
on d00's uplink: a tensor whose dtype is a JSON list, an update without ``num_samples``, a
float64 tensor full of 1e300 of the right shape, ``train_loss`` ±1e308 (written raw), a header
nested 100,000 deep, an update naming another algorithm, and d00's own update of the previous
round replayed with its round relabelled and its checksum recomputed; for each evaluate request,
a metrics reply with ``accuracy: "nan"``. d00 is slowed (``--delay``) so that all of this arrives
before its real reply. It also sends d01 malformed downlinks (garbage, a dtype list, another
algorithm): d01 must survive and keep serving.
"""

import json
import struct

import numpy as np
import pytest

from edgefl.runtime.server import ServeOptions
from edgefl.transport.broker import MosquittoBroker
from edgefl.wire import decode, encode
from edgefl.wire.validate import peek
from tests import wire_fuzz
from tests.conftest import scaled, tiny_config
from tests.needs import need_mosquitto
from tests.server_device_cases import Peer, round_records, serve_with_devices

pytestmark = pytest.mark.slow


def _rewrite(
    data: bytes, routing_changes=None, meta_changes=None, tensor_changes=None, drop_meta=()
) -> bytes:
    """Re-write a captured envelope with changes, checksum recomputed (as an attacker can)."""
    header, body = wire_fuzz._header(data)
    routing = dict(header["__metadata__"])
    tensors = wire_fuzz._tensors_of(header, body)
    meta = json.loads(routing["meta"])
    meta.update(meta_changes or {})
    for k in drop_meta:
        meta.pop(k, None)
    routing["meta"] = json.dumps(meta)
    routing.update(routing_changes or {})
    for name, change in (tensor_changes or {}).items():
        tensors[name] = change(tensors[name])
    routing.pop("message_id")
    routing["message_id"] = f"{np.random.default_rng().integers(2**62):032x}"[-32:]
    return wire_fuzz.write(routing, tensors)


class Attacker(Peer):
    def __init__(self, port: int, fleet: str):
        super().__init__(port, fleet, "attacker")
        # d00's own update of an earlier round, for the replay
        self.last_update: bytes | None = None
        # the model's arrays as last seen on d00's downlink: a train request after an evaluation
        # carries none (the device already holds the evaluation's model)
        self.arrays: dict = {}
        self.downlink_with_arrays: bytes | None = None
        self.injected: dict[str, int] = {}
        self.replayed_in: list[int] = []  # rounds in which an earlier update was replayed
        self.mine: set[str] = set()  # message ids of our own injections (they echo on the uplink)

    def on_connect(self, client, userdata, flags, reason, props):
        client.subscribe(self.topics.device("d00", "down"), qos=1)
        client.subscribe(self.topics.device("d00", "up"), qos=1)

    def send(self, name: str, data: bytes, device: str = "d00", leaf: str = "up"):
        try:
            self.mine.add(peek(data).message_id)
        except Exception:  # noqa: BLE001 - unreadable on purpose
            pass
        self.client.publish(self.topics.device(device, leaf), data, qos=1)
        with self.lock:
            self.injected[name] = self.injected.get(name, 0) + 1

    def on_message(self, client, userdata, msg):
        try:
            r = peek(msg.payload)
        except Exception:  # noqa: BLE001 - our own injections echo back on the uplink
            return
        if msg.topic.endswith("/up"):
            if r.kind == "update" and r.message_id not in self.mine:  # d00's real update
                self.last_update = bytes(msg.payload)
            return
        if r.message_id in self.seen or r.kind not in ("train", "evaluate"):
            return
        self.seen.add(r.message_id)
        request = decode(msg.payload)
        if request.payload.arrays:
            self.arrays = {k: np.array(v) for k, v in request.payload.arrays.items()}
            self.downlink_with_arrays = bytes(msg.payload)
        if r.kind == "evaluate":
            honest = encode(request.reply("metrics", _payload({}, {"accuracy": 0.5})))
            self.send("accuracy nan", _rewrite(honest, meta_changes={"accuracy": "nan"}))
            return
        arrays = self.arrays
        good = encode(
            request.reply("update", _payload(arrays, {"num_samples": 10, "train_loss": 1.0}))
        )
        name = next(k for k, v in arrays.items() if v.ndim >= 2)
        self.send(
            "dtype list", _rewrite(good, tensor_changes={name: lambda t: (["F32"], t[1], t[2])})
        )
        self.send("no num_samples", _rewrite(good, drop_meta=("num_samples",)))
        self.send(
            "float64 1e300",
            _rewrite(
                good, tensor_changes={name: lambda t: ("F64", t[1], np.full(t[1], 1e300).tobytes())}
            ),
        )
        self.send("train_loss 1e308", _rewrite(good, meta_changes={"train_loss": 1e308}))
        deep = b"[" * 100_000
        self.send("deep header", struct.pack("<Q", len(deep)) + deep)
        self.send("other algorithm", _rewrite(good, routing_changes={"algorithm": "felo"}))
        if self.last_update is not None:
            self.send(
                "replay relabelled",
                _rewrite(self.last_update, routing_changes={"round": str(request.round)}),
            )
            self.replayed_in.append(request.round)
        # malformed downlinks to d01
        self.send("garbage downlink", b"\x07 no envelope", device="d01", leaf="down")
        down = _rewrite(
            self.downlink_with_arrays, routing_changes={"device": "d01", "nonce": "0" * 32}
        )
        self.send(
            "dtype list downlink",
            _rewrite(down, tensor_changes={name: lambda t: (["F32"], t[1], t[2])}),
            device="d01",
            leaf="down",
        )
        self.send(
            "other algorithm downlink",
            _rewrite(down, routing_changes={"algorithm": "felo"}),
            device="d01",
            leaf="down",
        )


def _payload(arrays, meta):
    from edgefl.wire import Payload

    return Payload(arrays, meta)


def test_injected_messages_never_crash_displace_or_reach_the_model(
    tmp_path, profile_file, caplog  # noqa: F811
):
    need_mosquitto()
    rounds, deadline = 3, scaled(60)
    cfg = tiny_config(
        tmp_path, algorithm="fedavg", rounds=rounds, clients=3, eval_every=1
    ).model_copy(update={"min_devices": 3})
    fleet = "injection"
    broker = MosquittoBroker(port=0).start()
    attacker = Attacker(broker.port, fleet).start()
    try:
        opts = ServeOptions(broker=broker.url, fleet=fleet, deadline=deadline)
        box, codes = serve_with_devices(cfg, opts, 3, tmp_path, profile_file, join=600)
    finally:
        attacker.stop()
        broker.stop()

    assert "error" not in box, box.get("error")
    # every device (d01 with its malformed downlinks too) served to the end
    assert codes == [0, 0, 0]
    records = round_records(box)
    # no real update lost
    assert [r["completed"] for r in records] == [["d00", "d01", "d02"]] * rounds
    assert all(r["failed"] == {} for r in records)
    # no round waited out its deadline
    assert all(r["round_seconds"] < deadline / 2 for r in records)
    # every injection of a train exchange was refused and counted against d00 in the round's
    # record: six per round, and the replay of d00's earlier update where there was one
    assert attacker.replayed_in, "no update was replayed"
    # (the attacker saw wire rounds: a training request carries the round's index from 0)
    assert [r["rejected"].get("d00", 0) for r in records] == [
        6 + attacker.replayed_in.count(r["round"] - 1) for r in records
    ]
    logs = caplog.text
    for reason in (
        "nonce",
        "algorithm 'felo' does not match",
        "dtype float64",
        "num_samples: Field required",
        "train_loss",
        "nests deeper than the parser",
        "accuracy",
        "dtype",
    ):
        assert reason in logs, reason
    state = box["state"]
    weights = [v for k, v in state.items() if k.startswith("w/")]
    assert weights and all(
        v.dtype == np.float32 and np.isfinite(v).all() and np.abs(v).max() < 100
        for v in weights
        if v.dtype.kind == "f"
    )
    assert 0.0 <= box["summary"]["mean_accuracy"] <= 1.0
