"""Every registered algorithm through the one round loop, plus the shared pieces it relies on."""

import json

import numpy as np
import pytest
import torch

from edgefl.algorithms import algorithm_names, get_algorithm
from edgefl.algorithms.aggregate import weighted_average
from edgefl.algorithms.base import ServerContext, ServerHalf, TrainSettings
from edgefl.algorithms.fedprox import proximal_term
from edgefl.errors import ConfigError, UnknownNameError
from edgefl.runtime.simulation import simulate
from tests.conftest import SMALL_WORK, tiny_config


@pytest.mark.parametrize("name", algorithm_names())
def test_every_algorithm_runs_two_rounds_in_memory(tmp_path, name):
    cfg = tiny_config(tmp_path, algorithm=name, options=SMALL_WORK.get(name, {}))
    summary = simulate(cfg)
    algo = get_algorithm(name)
    expected_rounds = 2 + algo.needs_for(algo.parse_options(cfg.options)).closing_rounds
    assert len(summary["bytes_up_per_round"]) == expected_rounds
    assert summary["failed_per_round"] == [0] * expected_rounds
    assert len(summary["client_accuracy"]) == 3
    assert 0.0 <= summary["mean_accuracy"] <= 1.0
    assert all(b > 0 for b in summary["bytes_down_per_round"])
    run = tmp_path / "run"
    rounds = [json.loads(line) for line in (run / "rounds.jsonl").read_text().splitlines()]
    # from 1, as the console counts
    assert [r["round"] for r in rounds] == list(range(1, expected_rounds + 1))
    assert json.loads((run / "config.json").read_text())["algorithm"] == name
    assert (run / "summary.md").exists()


def test_weighted_average_matches_numpy():
    rng = np.random.default_rng(0)
    items = [
        ({"a": rng.normal(size=(3, 2)).astype(np.float32), "n": np.array(4)}, w)
        for w in (1.0, 3.0, 6.0)
    ]
    out = weighted_average(items)
    ref = sum(a["a"].astype(np.float64) * w for a, w in items) / 10.0
    np.testing.assert_allclose(out["a"], ref, rtol=1e-6)
    assert out["a"].dtype == np.float32 and out["n"].dtype == items[0][0]["n"].dtype


def test_fedavg_server_weights_by_sample_count(tmp_path):
    cfg = tiny_config(tmp_path, algorithm="fedavg", rounds=1)
    from edgefl.algorithms.fedavg import GlobalModelServer
    from edgefl.wire import Payload

    server = _server(GlobalModelServer, cfg)
    key = next(k for k in server.weights if k.endswith("weight"))
    ups = {}
    for d, (n, v) in {"d00": (10, 1.0), "d01": (30, 5.0)}.items():
        arrays = {k: np.full_like(a, v) for k, a in server.weights.items()}
        ups[d] = Payload(arrays, {"num_samples": n})
    server.aggregate(0, ups)
    np.testing.assert_allclose(server.weights[key], (10 * 1.0 + 30 * 5.0) / 40)


def _server(cls, cfg):
    from edgefl.algorithms import DeviceRecord
    from edgefl.data import dataset_info
    from edgefl.runtime.setup import fleet_specs

    info = dataset_info("synthetic")
    specs = fleet_specs(cfg, ["d00", "d01"], info)
    ctx = ServerContext(
        10, {d: DeviceRecord(s, 10) for d, s in specs.items()}, TrainSettings(), rounds=1, seed=0
    )
    return cls(ctx, get_algorithm(cfg.algorithm).parse_options({}))


def test_proximal_term_is_squared_distance():
    model = torch.nn.Linear(3, 2)
    anchor = [p.detach().clone() for p in model.parameters()]
    assert proximal_term(model, anchor).item() == 0.0
    with torch.no_grad():
        model.weight.add_(0.5)
    assert proximal_term(model, anchor).item() == pytest.approx(6 * 0.25)


def test_default_selection_samples_a_fraction_reproducibly():
    ctx = ServerContext(10, {}, TrainSettings(), rounds=1, seed=3, fraction=0.3, min_fit=1)
    half = ServerHalf(ctx, None)
    ids = [f"d{i:02d}" for i in range(10)]
    a = half.select(4, ids, ctx.rng(4))
    assert len(a) == 3 and set(a) <= set(ids)
    assert a == half.select(4, ids, ctx.rng(4))
    assert any(half.select(r, ids, ctx.rng(r)) != a for r in range(5, 10))


@pytest.mark.parametrize(("fraction", "min_fit"), [(1.0, 1), (0.3, 12)])
def test_selecting_every_device_gives_what_the_draw_gives(fraction, min_fit):
    ctx = ServerContext(10, {}, TrainSettings(), rounds=1, seed=3, fraction=fraction,
                        min_fit=min_fit)
    ids = [f"d{i:02d}" for i in (7, 2, 9, 0, 4)]
    drawn = sorted(ctx.rng(4).choice(sorted(ids), size=len(ids), replace=False).tolist())
    assert ServerHalf(ctx, None).select(4, ids, ctx.rng(4)) == drawn == sorted(ids)


def test_same_seed_reproduces_partition_and_first_round(tmp_path):
    a = simulate(
        tiny_config(
            tmp_path / "a", algorithm="fedavg", partition="dirichlet", alpha=0.3, eval_every=1
        )
    )
    b = simulate(
        tiny_config(
            tmp_path / "b", algorithm="fedavg", partition="dirichlet", alpha=0.3, eval_every=1
        )
    )
    ca = json.loads((tmp_path / "a/run/config.json").read_text())["fleet"]
    cb = json.loads((tmp_path / "b/run/config.json").read_text())["fleet"]
    assert ca == cb
    ra = json.loads((tmp_path / "a/run/rounds.jsonl").read_text().splitlines()[0])
    rb = json.loads((tmp_path / "b/run/rounds.jsonl").read_text().splitlines()[0])
    assert ra["train_loss"] == rb["train_loss"] and ra["eval"] == rb["eval"]
    assert a["client_accuracy"] == b["client_accuracy"]
    simulate(
        tiny_config(tmp_path / "c", algorithm="fedavg", partition="dirichlet", alpha=0.3, seed=1)
    )
    cc = json.loads((tmp_path / "c/run/config.json").read_text())["fleet"]
    assert [v["num_samples"] for v in cc.values()] != [v["num_samples"] for v in ca.values()]


def test_a_knowledge_method_with_dropout_repeats_exactly_whatever_ran_before(tmp_path):
    # FedProto's default CNNs have dropout, drawn from torch's global generator; each device's
    # local work runs under a generator seeded per (device, round), so what ran before in the
    # process (here: a different run, and a torch.rand call) changes nothing.
    def last_losses(name):
        simulate(tiny_config(tmp_path / name, algorithm="fedproto", fraction=1.0, threads=1))
        rounds = (tmp_path / name / "run/rounds.jsonl").read_text().splitlines()
        return [json.loads(line)["train_loss"] for line in rounds]

    first = last_losses("a")
    torch.rand(1000)
    simulate(tiny_config(tmp_path / "other", algorithm="fedavg", seed=5))
    assert last_losses("b") == first
    assert any(v > 0 for r in first for v in r.values())


def test_options_are_typed_and_checked():
    prox = get_algorithm("fedprox")
    assert prox.parse_options({"mu": "0.5"}).mu == 0.5
    with pytest.raises(ConfigError, match="its options are: aggregator, clip_norm, mu, trim"):
        prox.parse_options({"nu": "1"})
    with pytest.raises(ConfigError, match="not a valid float"):
        prox.parse_options({"mu": "lots"})
    with pytest.raises(ConfigError, match="mu must be >= 0"):
        prox.parse_options({"mu": "-1"})
    with pytest.raises(UnknownNameError, match="fedavg"):
        get_algorithm("fedsgd")


def test_fedavg_refuses_a_heterogeneous_fleet(tmp_path):
    with pytest.raises(ConfigError, match="one global model"):
        simulate(tiny_config(tmp_path, algorithm="fedavg", tiers=("1", "2")))


def test_devices_get_the_pool_only_when_the_method_says_they_hold_it(tmp_path):
    summary = simulate(
        tiny_config(
            tmp_path, algorithm="fedhenn", options={"rad_source": "device", "rad_size": "20"}
        )
    )
    assert summary["failed_per_round"] == [0, 0]
    from edgefl.algorithms.fedhenn import FedHeNNOptions

    fedhenn = get_algorithm("fedhenn")
    assert fedhenn.needs_for(FedHeNNOptions(rad_source="device")).devices_hold_public
    assert not fedhenn.needs_for(FedHeNNOptions()).devices_hold_public
    assert fedhenn.needs_for(FedHeNNOptions()).public_share == 0.02


def test_the_start_threshold_is_not_the_per_round_minimum(tmp_path):
    # Prepare: 6 devices, all needed to start; half of them trained per round
    cfg = tiny_config(tmp_path, algorithm="fedavg", clients=6, min_devices=6, fraction=0.5,
                      rounds=1, train_samples=360)
    # Execute
    simulate(cfg)
    # Assert: the round trained what --fraction implies, not --min-devices
    record = json.loads((tmp_path / "run" / "rounds.jsonl").read_text().splitlines()[0])
    assert len(record["selected"]) == 3


def test_min_fit_is_the_fewest_devices_a_round_trains():
    ids = [f"d{i:02d}" for i in range(10)]
    # fraction 0.2 of 10 = 2; capped at the fleet
    for min_fit, expected in [(1, 2), (5, 5), (12, 10)]:
        ctx = ServerContext(
            10, {}, TrainSettings(), rounds=1, seed=3, fraction=0.2, min_fit=min_fit
        )
        assert len(ServerHalf(ctx, None).select(0, ids, ctx.rng(0))) == expected
    with pytest.raises(ConfigError, match="min_fit"):
        tiny_config(None, clients=3, min_fit=4)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_local_optimizer_is_fused_with_the_per_parameter_loops_update(optimizer):
    # Prepare: a small conv model, twice from the same weights, and one batch
    from edgefl.algorithms.training import make_optimizer
    from edgefl.models import ModelSpec, build_model

    torch.manual_seed(0)
    spec = ModelSpec(
        "resnet",
        "10",
        num_classes=10,
        in_shape=(1, 28, 28),
        width=0.125,
        options={"stem": "imagenet"},
    )
    fused_model, loop_model = build_model(spec), build_model(spec)
    loop_model.load_state_dict(fused_model.state_dict())
    initial = [p.detach().clone() for p in fused_model.parameters()]
    settings = TrainSettings(optimizer=optimizer, lr=0.05, momentum=0.9, weight_decay=1e-3)
    fused = make_optimizer(fused_model.parameters(), settings, round=0)
    kind = torch.optim.SGD if optimizer == "sgd" else torch.optim.Adam
    extra = {"momentum": 0.9} if optimizer == "sgd" else {}
    loop = kind(loop_model.parameters(), lr=0.05, weight_decay=1e-3, foreach=False, **extra)
    x, y = torch.rand(8, 1, 28, 28), torch.arange(8) % 10
    # Execute: two steps each (the second uses the optimizer's state: momentum, Adam's moments)
    for model, opt in ((fused_model, fused), (loop_model, loop)):
        for _ in range(2):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    # Assert: fused on CPU, the weights moved, and by the same update rule: the two agree to float
    # rounding, which Adam's division by the root of its second moment can grow to ~1e-4 of a step
    assert fused.defaults["fused"] is True
    assert all(
        not torch.equal(a, b) for a, b in zip(fused_model.parameters(), initial, strict=True)
    )
    for a, b in zip(fused_model.parameters(), loop_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_make_optimizer_fuses_parameter_groups_and_refuses_an_unknown_optimizer_by_name():
    from edgefl.algorithms.training import make_optimizer

    groups = [
        {"params": [torch.nn.Parameter(torch.zeros(3))]},
        {"params": [torch.nn.Parameter(torch.ones(2))]},
    ]
    assert make_optimizer(groups, TrainSettings(optimizer="sgd"), round=0).defaults["fused"] is True
    with pytest.raises(ConfigError, match="unknown optimizer"):
        make_optimizer(
            [torch.nn.Parameter(torch.zeros(3))], TrainSettings(optimizer="rmsprop"), round=0
        )
