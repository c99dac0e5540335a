"""Velo's CVAE (trained, checkpointed as arrays, the same at any thread count), whole runs of Felo,
Velo and FedHe, their defaults and what their uplinks carry (batch-norm counters and statistics
included)."""

import json

import numpy as np
import pytest
import safetensors.numpy
import torch

from edgefl.algorithms import (
    get_algorithm,
)
from edgefl.algorithms.cvae import CVAE, conditional_fit, generate, train_cvae
from edgefl.algorithms.felo import (
    VeloOptions,
    VeloServer,
)
from edgefl.config import resolve_config
from edgefl.errors import ConfigError
from edgefl.runtime.simulation import simulate
from edgefl.wire import Payload
from tests.conftest import tiny_config
from tests.felo_cases import (
    C,
    _one_thread,  # noqa: F401 (autouse)
    reference_means,
    server_ctx,
    uplink,
)


# -- the CVAE --------------------------------------------------------------------------------------
def test_cvae_learns_class_conditional_gaussians():
    # Prepare: 4 classes in 8 dims, means 3 apart, std 0.3
    rng = np.random.default_rng(0)
    means = rng.normal(size=(4, 8)) * 3
    labels = np.repeat(np.arange(4), 150)
    feats = means[labels] + 0.3 * rng.normal(size=(len(labels), 8))
    torch.manual_seed(0)
    cvae = CVAE(4, 8, embed_dim=32)
    # Execute
    losses = train_cvae(cvae, feats, labels, epochs=25, batch_size=50, lr=1e-3, seed=0)
    samples = generate(cvae, np.repeat(np.arange(4), 25), seed=1)
    # Assert: training lowers the loss; every sample is nearest to its own class mean
    assert losses[-1] < 0.5 * losses[0]
    dist = ((samples[:, None, :] - means[None]) ** 2).sum(-1)
    assert (dist.argmin(1) == np.repeat(np.arange(4), 25)).all()
    assert (
        generate(cvae, np.arange(4), seed=5).tolist()
        == generate(cvae, np.arange(4), seed=5).tolist()
    )
    # the fit Velo reports: samples land in their class; an untrained CVAE's do not
    fit, real, spread = conditional_fit(cvae, feats, labels, seed=0)
    assert fit == 1.0 and real == 1.0 and 0 < spread < 10
    untrained_fit, _, _ = conditional_fit(CVAE(4, 8, embed_dim=32), feats, labels, seed=0)
    assert untrained_fit < 0.75


def test_cvae_training_is_the_same_at_any_caller_thread_count_and_restores_it():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(3), 40)
    feats = rng.normal(size=(len(labels), 8)).astype(np.float32) + labels[:, None]
    threads = torch.get_num_threads()
    weights = []
    try:
        for caller in (2, 1):
            torch.set_num_threads(caller)
            torch.manual_seed(0)
            cvae = CVAE(3, 8, embed_dim=16)
            train_cvae(cvae, feats, labels, epochs=2, batch_size=20, lr=1e-3, seed=0)
            assert torch.get_num_threads() == caller  # the caller's count, back after training
            weights.append({k: v.clone() for k, v in cvae.state_dict().items()})
    finally:
        torch.set_num_threads(threads)
    # trained at one thread both times
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_velo_server_trains_the_cvae_and_checkpoints_it_as_arrays(tmp_path):
    # Prepare: points around per-class centres
    options = VeloOptions(cvae_epochs=3, warmup_fraction=0.0)
    server = VeloServer(server_ctx(["10", "14"]), options)
    rng = np.random.default_rng(4)
    centres = rng.normal(size=(C, 64)).astype(np.float32)
    ups = {}
    for d in ("d00", "d01"):
        p = uplink([4] * 5 + [0] * 5, rng)
        labels = np.repeat(np.arange(5), 6)
        p.arrays["point"] = (centres[labels] + 0.1 * rng.normal(size=(30, 64))).astype(np.float32)
        p.arrays["point_label"] = labels.astype(np.int64)
        ups[d] = p
    # Execute
    metrics = server.aggregate(0, ups)
    down = server.downlink(1, "d00").arrays
    # Assert: trained on all 60 points; synthetic features replace the averages; only classes with
    # data known
    assert metrics["cvae_points"] == 60 and np.isfinite(metrics["cvae_loss"])
    assert down["known"].tolist() == [1] * 5 + [0] * 5
    ref, _ = reference_means(list(ups.values()), "feat")
    assert not np.allclose(down["feat"][:5], ref[:5])
    # a checkpoint is plain safetensors; a fresh server restored from it sends the same downlink
    safetensors.numpy.save_file(
        {k: np.ascontiguousarray(v) for k, v in server.state_dict().items()}, tmp_path / "s"
    )
    restored = VeloServer(server_ctx(["10", "14"]), options)
    restored.load_state_dict(safetensors.numpy.load_file(tmp_path / "s"))
    again = restored.downlink(1, "d00").arrays
    assert again.keys() == down.keys()
    for k in down:
        np.testing.assert_array_equal(again[k], down[k])
    assert server.aggregate(1, {})["known_classes"] == 5  # a round where nobody reported is fine


def test_velo_trains_every_interval_after_warmup():
    # 2 warm-up rounds
    server = VeloServer(server_ctx(["10"], rounds=40), VeloOptions(cvae_interval=3))
    # until a first training
    assert [r for r in range(10) if server.train_due(r)] == list(range(1, 10))
    server.trained = True
    assert [r for r in range(10) if server.train_due(r)] == [1, 4, 7]


# -- whole runs ------------------------------------------------------------------------------------
def test_felo_devices_of_one_architecture_share_a_model_fedhe_devices_do_not(tmp_path):
    common = {
        "clients": 4,
        "tiers": ("10", "14"),
        "fraction": 1.0,
        "rounds": 2,
        "partition": "dirichlet",
        "alpha": 1.0,
    }
    felo = simulate(tiny_config(tmp_path / "felo", algorithm="felo", **common))
    fedhe = simulate(tiny_config(tmp_path / "fedhe", algorithm="fedhe", **common))
    acc, acc_he = felo["client_accuracy"], fedhe["client_accuracy"]
    # tiers round-robin: 10, 14, 10, 14
    assert acc["d00"] == acc["d02"] and acc["d01"] == acc["d03"]
    rounds = [
        json.loads(line) for line in (tmp_path / "felo/run/rounds.jsonl").read_text().splitlines()
    ]
    assert rounds[0]["server"]["architectures_averaged"] == 2
    # FedHe sends about a kilobyte of knowledge per device; Felo adds the weights
    he_rounds = [
        json.loads(line) for line in (tmp_path / "fedhe/run/rounds.jsonl").read_text().splitlines()
    ]
    per_device = lambda rs: [b for r in rs for b in r["bytes_up"].values()]  # noqa: E731
    assert max(per_device(he_rounds)) < 2000 < min(per_device(rounds))
    assert len(set(acc_he.values())) > 1 or acc_he["d00"] != acc["d00"]


def test_felo_without_distillation_on_one_architecture_is_fedavg_bit_for_bit(tmp_path):
    # alpha=0 leaves Felo's path: same-architecture FedAvg, cross-entropy, the same data order;
    # its server starts the architecture from FedAvg's draw, so every weight (BatchNorm's
    # statistics too), every loss and every accuracy must be FedAvg's. Two rounds: the second
    # distils (after the warm-up), with its terms weighted by 0.
    common = {
        "model": "resnet",
        "model_options": {"stem": "imagenet"},
        "tiers": ("10",),
        "width": 0.125,
        "optimizer": "adam",
        "lr": 1e-3,
        "epochs": 1,
        "clients": 3,
        "fraction": 1.0,
        "partition": "dirichlet",
        "alpha": 0.5,
        "eval_every": 1,
    }
    runs = {
        "fedavg": tiny_config(tmp_path / "fedavg", algorithm="fedavg", **common),
        "felo": tiny_config(tmp_path / "felo", algorithm="felo", options={"alpha": "0"}, **common),
    }
    # the same run but for the method (the two methods' defaults differ: all are given here)
    differ = {"algorithm", "options", "out_dir"}
    same = {k: v for k, v in vars(runs["felo"]).items() if k not in differ}
    assert same == {k: v for k, v in vars(runs["fedavg"]).items() if k not in differ}
    results = {name: simulate(cfg) for name, cfg in runs.items()}
    assert results["felo"]["client_accuracy"] == results["fedavg"]["client_accuracy"]

    def rounds(name):
        lines = (tmp_path / name / "run/rounds.jsonl").read_text().splitlines()
        # the last round's evaluation is the final one
        return [(r["train_loss"], r.get("eval")) for r in map(json.loads, lines)]

    felo_rounds = rounds("felo")
    assert len(felo_rounds) == 2 and felo_rounds[0][1]["client_accuracy"]
    assert felo_rounds == rounds("fedavg")
    for device in results["fedavg"]["client_accuracy"]:
        felo, fedavg = (
            safetensors.numpy.load_file(tmp_path / name / f"run/models/{device}.safetensors")
            for name in ("felo", "fedavg")
        )
        assert felo.keys() == fedavg.keys() and any("running_mean" in k for k in felo)
        for k in felo:
            np.testing.assert_array_equal(felo[k], fedavg[k], err_msg=k)


def test_velo_run_records_cvae_training(tmp_path):
    simulate(
        tiny_config(
            tmp_path,
            algorithm="velo",
            rounds=3,
            clients=2,
            fraction=1.0,
            options={"cvae_epochs": "2"},
        )
    )
    rounds = [json.loads(line) for line in (tmp_path / "run/rounds.jsonl").read_text().splitlines()]
    # warm-up is 1 round: training starts at round 0
    assert all("cvae_loss" in r["server"] for r in rounds)
    assert rounds[-1]["server"]["cvae_points"] > rounds[0]["server"]["cvae_points"]


def test_defaults_are_the_papers_and_model_options_follow_the_model():
    felo = get_algorithm("felo")
    cfg = resolve_config({}, felo.defaults)
    # the code's model, optimizer and batch; our local budget (two epochs, every device every round)
    assert (
        cfg.model,
        cfg.tiers,
        cfg.optimizer,
        cfg.lr,
        cfg.batch_size,
        cfg.steps,
        cfg.epochs,
        cfg.fraction,
    ) == (
        "resnet",
        ("10", "14", "18", "22", "26"),
        "adam",
        1e-3,
        50,
        None,
        2,
        1.0,
    )
    assert cfg.model_options == {"stem": "imagenet"}
    assert resolve_config({"model": "cnn"}, felo.defaults).model_options == {}
    assert felo.parse_options({"alpha": "0.25"}).alpha == 0.25
    with pytest.raises(ConfigError, match="feature_upload"):
        get_algorithm("velo").parse_options({"feature_upload": "everything"})


def test_batchnorm_counters_keep_their_shape_over_the_wire():
    # Felo uploads whole state dicts; BatchNorm's num_batches_tracked is a 0-d tensor
    from edgefl.wire import Envelope, decode, encode

    arrays = {
        "w/bn.num_batches_tracked": np.array(7, np.int64),
        "w/x": np.ones((3, 4), np.float32)[:, ::2],
    }
    env = decode(
        encode(
            Envelope(
                kind="update", round=0, device_id="d00", payload=Payload(arrays, {"num_samples": 1})
            )
        )
    )
    assert env.payload.arrays["w/bn.num_batches_tracked"].shape == ()
    assert env.payload.arrays["w/x"].shape == (3, 2)

