"""The round loop: failures are data, checkpoints resume, evaluation reports per tier."""

import dataclasses
import json

import numpy as np

from edgefl.algorithms import (
    DeviceContext,
    DeviceRecord,
    ServerContext,
    TrainSettings,
    get_algorithm,
)
from edgefl.data import load_dataset
from edgefl.runtime.agent import DeviceAgent
from edgefl.runtime.exchange import LoopSettings
from edgefl.runtime.loop import RoundLoop
from edgefl.runtime.setup import fleet_specs
from edgefl.runtime.simulation import simulate
from edgefl.transport import InMemoryTransport
from edgefl.wire import Payload
from tests.conftest import tiny_config


def _fleet(tmp_path, n=3, **overrides):
    cfg = tiny_config(tmp_path, algorithm="fedavg", **overrides)
    train = load_dataset("synthetic", "train").subset(np.arange(300))
    test = load_dataset("synthetic", "test").subset(np.arange(100))
    ids = [f"d{i:02d}" for i in range(n)]
    specs = fleet_specs(cfg, ids, train.info)
    algo = get_algorithm("fedavg")
    settings = TrainSettings(steps=2, batch_size=16, lr=0.05)
    transport = InMemoryTransport()
    fleet = {}
    for i, d in enumerate(ids):
        data = train.subset(np.arange(i * 100, (i + 1) * 100))
        half = algo.device(
            DeviceContext(d, specs[d], data, settings, seed=i, rounds=2), algo.parse_options({})
        )
        transport.connect(d, DeviceAgent(half, eval_sets={"quick": test, "test": test}).handle)
        fleet[d] = DeviceRecord(specs[d], len(data))
    ctx = ServerContext(10, fleet, settings, rounds=2, seed=0)
    return algo, ctx, transport


def test_a_crashing_device_is_recorded_and_the_round_goes_on(tmp_path):
    algo, ctx, transport = _fleet(tmp_path)

    def crash(env):
        raise ConnectionError("device unplugged")

    transport.connect("d01", crash)
    records = []
    loop = RoundLoop(
        algo.server(ctx, None), ctx, transport, LoopSettings(rounds=2), on_round=records.append
    )
    final = loop.run()
    assert all("d01" in r["failed"] and "unplugged" in r["failed"]["d01"] for r in records)
    assert all(r["completed"] == ["d00", "d02"] for r in records)
    assert set(final["client_accuracy"]) == {"d00", "d02"}


def test_a_reply_that_would_not_decode_or_does_not_answer_is_rejected_not_fatal(tmp_path):
    # in memory, the checks a decoder applies (here: finite values) and the loop's own (here: the
    # nonce)
    algo, ctx, transport = _fleet(tmp_path)
    transport.connect(
        "d02",
        lambda env: env.reply(
            "update", Payload({"w/x": np.array([np.nan], np.float32)}, {"num_samples": 1})
        ),
    )
    transport.connect(
        "d01",
        lambda env: dataclasses.replace(
            env.reply("update", Payload({}, {"num_samples": 1})), nonce="replayed"
        ),
    )
    records = []
    RoundLoop(
        algo.server(ctx, None), ctx, transport, LoopSettings(rounds=1), on_round=records.append
    ).run()
    assert (
        records[0]["failed"]["d02"].startswith("rejected")
        and "non-finite" in records[0]["failed"]["d02"]
    )
    assert (
        records[0]["failed"]["d01"].startswith("rejected")
        and "nonce" in records[0]["failed"]["d01"]
    )
    assert records[0]["completed"] == ["d00"]


def test_checkpoint_resumes_after_the_last_completed_round(tmp_path):
    algo, ctx, transport = _fleet(tmp_path)
    ck = tmp_path / "ck"
    server = algo.server(ctx, None)
    RoundLoop(server, ctx, transport, LoopSettings(rounds=1, checkpoint_dir=ck)).run()
    saved = {k: v.copy() for k, v in server.state_dict().items()}

    fresh = algo.server(ctx, None)
    records = []
    loop = RoundLoop(
        fresh, ctx, transport, LoopSettings(rounds=3, checkpoint_dir=ck), on_round=records.append
    )
    assert loop.start_round == 1
    for k, v in saved.items():
        np.testing.assert_array_equal(fresh.state_dict()[k], v)
    loop.run()
    assert [r["round"] for r in records] == [2, 3]  # rounds from 1: round 1 was done before


def test_evaluation_reports_accuracy_per_tier(tmp_path):
    algo, ctx, transport = _fleet(tmp_path)
    loop = RoundLoop(algo.server(ctx, None), ctx, transport, LoopSettings(rounds=1))
    ev = loop.evaluate(0, "test", with_downlink=True)
    # every device got the same global model: identical accuracy, one tier
    assert len(set(ev["client_accuracy"].values())) == 1
    assert list(ev["tier_accuracy"]) == [ctx.fleet["d00"].spec.tier]
    assert ev["mean_accuracy"] == ev["client_accuracy"]["d00"]


def test_an_evaluation_downlink_is_not_sent_again_to_train_and_training_is_unchanged(tmp_path):
    # Prepare: the same FedAvg run evaluated every round (devices then hold the global model
    # before they train) and never evaluated (every train request carries the model)
    common = {"algorithm": "fedavg", "rounds": 3, "clients": 3, "fraction": 1.0}
    evaluated = simulate(tiny_config(tmp_path / "a", eval_every=1, **common))
    plain = simulate(tiny_config(tmp_path / "b", eval_every=100, **common))
    # Assert: the same final models; rounds 1 and 2 send no weights to train on
    assert evaluated["client_accuracy"] == plain["client_accuracy"]
    rounds = [json.loads(x) for x in (tmp_path / "a/run/rounds.jsonl").read_text().splitlines()]
    plain_rounds = [
        json.loads(x) for x in (tmp_path / "b/run/rounds.jsonl").read_text().splitlines()
    ]
    assert rounds[0]["downlinks_not_resent"] == [] and rounds[1]["downlinks_not_resent"] == [
        "d00",
        "d01",
        "d02",
    ]
    weights = plain_rounds[1]["bytes_down"]["d00"]
    assert rounds[1]["bytes_down"]["d00"] < weights / 20  # an envelope with no arrays
    assert rounds[0]["eval_bytes_down"]["d00"] >= weights  # the evaluation carried the model
    assert rounds[0]["bytes_down_total"] == sum(rounds[0]["bytes_down"].values()) + sum(
        rounds[0]["eval_bytes_down"].values()
    )


def test_a_diverged_model_is_evaluated_at_its_accuracy_not_dropped(tmp_path):
    # Prepare: one device whose model has diverged (inf weights: a NaN loss, chance-level
    # predictions)
    import torch

    algo, ctx, transport = _fleet(tmp_path)
    agent = transport.handlers["d01"].__self__
    with torch.no_grad():
        for p in agent.half.model.parameters():
            p.fill_(float("inf"))
    loop = RoundLoop(algo.server(ctx, None), ctx, transport, LoopSettings(rounds=1))
    # Execute: evaluate without a downlink (the devices keep their own models)
    ev = loop.evaluate(0, "test", with_downlink=False)
    # Assert: it answered, its accuracy counts in the mean, and its loss is marked instead of sent
    assert ev["eval_failed"] == {} and set(ev["client_accuracy"]) == {"d00", "d01", "d02"}
    assert 0.0 <= ev["client_accuracy"]["d01"] <= 1.0
    metrics = agent.evaluate("test")
    assert metrics["loss_diverged"] is True and "loss" not in metrics


def test_a_round_whose_training_diverges_leaves_the_device_its_last_finite_model(tmp_path):
    # Prepare: a Local device (it keeps its own model across rounds) whose training is made to
    # diverge at its second round by a learning rate of 1e30
    import torch

    from edgefl.wire import Envelope

    cfg = tiny_config(tmp_path, algorithm="local")
    train = load_dataset("synthetic", "train").subset(np.arange(100))
    test = load_dataset("synthetic", "test").subset(np.arange(50))
    spec = fleet_specs(cfg, ["d00"], train.info)["d00"]
    algo = get_algorithm("local")
    settings = TrainSettings(steps=2, batch_size=16, lr=0.05)
    half = algo.device(DeviceContext("d00", spec, train, settings, seed=0, rounds=3),
                       algo.parse_options({}))
    agent = DeviceAgent(half, eval_sets={"test": test}, algorithm="local")

    def train_round(r):
        return agent.handle(Envelope(kind="train", round=r, device_id="d00", fleet="default",
                                     algorithm="local", payload=Payload()))

    assert train_round(0).kind == "update"
    good = {k: v.clone() for k, v in half.model.state_dict().items()}
    before = agent.evaluate("test")
    half.ctx = dataclasses.replace(half.ctx, settings=dataclasses.replace(settings, lr=1e30))
    # Execute: the diverging round, then an evaluation
    reply = train_round(1)
    # Assert: the round is an error saying why, and the model is the one before it, bit for bit,
    # so the device still evaluates (and would train, export) from finite weights
    assert reply.kind == "error" and "local work produced" in reply.payload.meta["reason"]
    after = half.model.state_dict()
    assert all(torch.equal(good[k], after[k]) for k in good)
    assert agent.evaluate("test") == before
    half.ctx = dataclasses.replace(half.ctx, settings=settings)
    assert train_round(2).kind == "update"
