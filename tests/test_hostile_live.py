"""Issue 36, live: an attacker holding device d00's broker credentials, in a running fleet (server +
4 device processes over Mosquitto, FedAvg with the median aggregator), re-registers d00 with a
count of 1e9 (once without a new registration epoch: refused; once with one: taken, logged, and
bounded), answers every train request first with the global model scaled by -5 claiming 1e9
samples, and every evaluation with accuracy 1.0. The final model, measured here on the test split
(not by any device), is within 2 points of the clean run's; the log names the refused and the
clipped claims; the summary marks every accuracy as device-reported.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from edgefl.runtime import simulation
from edgefl.runtime.server import ServeOptions
from edgefl.transport.broker import MosquittoBroker
from edgefl.wire import Envelope, Payload, decode, encode
from tests.conftest import scaled, tiny_config
from tests.needs import need_mosquitto
from tests.server_device_cases import Peer, serve_with_devices

pytestmark = pytest.mark.slow


class Liar(Peer):
    def __init__(self, port: int, fleet: str):
        super().__init__(port, fleet, "liar")
        self.arrays: dict = {}
        self.sent = {"register": 0, "update": 0, "metrics": 0}

    def publish(self, leaf: str, env: Envelope) -> None:
        self.client.publish(self.topics.device("d00", leaf), encode(env), qos=1)
        self.sent[env.kind] += 1

    def on_message(self, client, userdata, msg):
        try:
            request = decode(msg.payload)
        except Exception:  # noqa: BLE001 - chunks, acks, assignments for others
            return
        with self.lock:
            if request.message_id in self.seen or request.kind not in ("train", "evaluate"):
                return
            self.seen.add(request.message_id)
            if request.payload.arrays:
                self.arrays = {k: np.array(v) for k, v in request.payload.arrays.items()}
            if self.sent["register"] == 0:  # d00 is ready and training: re-declare its size
                profile = json.dumps(
                    {
                        "name": "d00",
                        "arch": "x",
                        "cpu_model": "x",
                        "cores": 1,
                        "ram_total_mb": 1,
                        "ram_available_mb": 1,
                    }
                )
                # no new epoch: refused; a new one: taken and bounded
                for extra in ({}, {"incarnation": "liar"}):
                    meta = {"profile": profile, "ready": True, "num_samples": 10**9, **extra}
                    self.publish(
                        "register",
                        Envelope("register", 0, "d00", fleet=self.fleet, payload=Payload({}, meta)),
                    )
            if request.kind == "evaluate":
                self.publish("up", request.reply("metrics", Payload({}, {"accuracy": 1.0})))
            elif self.arrays:
                scaled = {
                    k: (-5 * v).astype(v.dtype) if v.dtype.kind == "f" else v
                    for k, v in self.arrays.items()
                }
                self.publish(
                    "up",
                    request.reply(
                        "update", Payload(scaled, {"num_samples": 10**9, "train_loss": 0.0})
                    ),
                )


def measured_accuracy(cfg, state) -> float:
    """The global model's accuracy on the whole test split, measured here."""
    from edgefl.algorithms.training import evaluate
    from edgefl.data import dataset_info, load_dataset
    from edgefl.models import build_model
    from edgefl.runtime.setup import model_spec
    from edgefl.wire import arrays_to_state

    info = dataset_info(cfg.dataset)
    model = build_model(model_spec(cfg, cfg.tiers[0] if cfg.tiers else "2", info))
    model.load_state_dict(arrays_to_state(state))
    return evaluate(model, load_dataset(cfg.dataset, "test"))["accuracy"]


def test_a_lying_device_neither_poisons_the_model_nor_the_measured_results(
    tmp_path, profile_file, caplog  # noqa: F811
):
    need_mosquitto()
    cfg = tiny_config(
        tmp_path, algorithm="fedavg", rounds=3, clients=4, threads=1, fraction=1.0,
        eval_every=1, steps=6, options={"aggregator": "median"},
    ).model_copy(update={"min_devices": 4})
    clean = []
    simulation.simulate(
        cfg.model_copy(update={"run_name": "clean"}), on_done=lambda s: clean.append(s.state_dict())
    )
    fleet = "liar"
    broker = MosquittoBroker(port=0, workdir=tmp_path / "mosq").start()
    liar = Liar(broker.port, fleet).start()
    try:
        opts = ServeOptions(broker=broker.url, fleet=fleet, deadline=scaled(60))
        attacked = cfg.model_copy(update={"run_name": "attacked"})
        box, codes = serve_with_devices(attacked, opts, 4, tmp_path, profile_file)
    finally:
        liar.stop()
        broker.stop()
    assert "error" not in box, box.get("error")
    assert codes == [0, 0, 0, 0]
    assert liar.sent["register"] == 2 and liar.sent["update"] >= 3 and liar.sent["metrics"] >= 3
    logs = caplog.text
    # refused
    assert "re-declared 1000000000 samples without a new registration epoch (declared" in logs
    # taken, logged
    assert "re-registered (registration epoch liar) declaring 1000000000 samples" in logs
    assert "device d00 claimed num_samples = 1e+09; clipped to" in logs  # and bounded
    summary = box["summary"]
    assert summary["registrations_rejected"] >= 1
    # the model: the server's final weights measured on the test split, against the clean run's
    attacked_acc, clean_acc = measured_accuracy(cfg, box["state"]), measured_accuracy(cfg, clean[0])
    assert abs(attacked_acc - clean_acc) <= 0.02, (attacked_acc, clean_acc)
    # the spoofed accuracy is in the summary only as what it is: a device's claim
    assert summary["client_accuracy"]["d00"] == 1.0
    assert {"mean_accuracy", "client_accuracy", "tier_accuracy"} <= set(
        summary["sources"]["device_reported"]
    )
    assert not {"mean_accuracy", "client_accuracy", "tier_accuracy"} & set(
        summary["sources"]["server_measured"]
    )
    assert summary["accuracy_reported_by"] == "devices"
    assert "as the devices report it" in (Path(summary["run_dir"]) / "summary.md").read_text()
