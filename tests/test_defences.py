"""Bounded influence of a well-formed but malicious update: norm bounds and robust rules."""

import numpy as np
import pytest

from edgefl.algorithms import get_algorithm
from edgefl.algorithms.aggregate import (
    Defences,
    clip_to_norm,
    clip_update,
    robust_average,
    robust_stack,
)
from edgefl.algorithms.fedproto import PrototypeTable
from edgefl.errors import ConfigError
from edgefl.wire import Payload

C = 10


def _honest_and_attacker(scale):
    rng = np.random.default_rng(0)
    honest = [
        {"w/a": rng.normal(1.0, 0.1, size=(4, 3)).astype(np.float32), "w/n": np.array(5)}
        for _ in range(8)
    ]
    attack = [{"w/a": np.full((4, 3), scale, np.float32), "w/n": np.array(5)} for _ in range(2)]
    return [(a, 10.0) for a in honest + attack]


@pytest.mark.parametrize("rule", ["median", "trimmed_mean"])
def test_robust_rules_keep_two_of_ten_attackers_from_moving_the_weights(rule):
    items = _honest_and_attacker(1e6)
    mean = robust_average(items, "mean")["w/a"]
    robust = robust_average(items, rule, trim=0.2)
    assert np.abs(mean - 1.0).min() > 1e4  # the plain mean is dragged away
    assert np.abs(robust["w/a"] - 1.0).max() < 0.2  # the robust rule stays with the honest eight
    assert (
        robust["w/a"].dtype == np.float32
        and robust["w/n"].dtype == np.int64
        and int(robust["w/n"]) == 5
    )


def test_trimmed_mean_drops_the_share_at_each_end():
    values = [np.array([v], np.float64) for v in (0.0, 1.0, 2.0, 3.0, 100.0)]
    # drops 0 and 100
    assert robust_stack(values, "trimmed_mean", trim=0.2)[0] == pytest.approx(2.0)
    assert robust_stack(values, "median")[0] == 2.0


def test_clip_update_bounds_the_distance_from_the_global_model():
    ref = {"w/a": np.zeros(4, np.float32), "w/n": np.array(1)}
    up = {"w/a": np.array([3.0, 4.0, 0.0, 0.0], np.float32), "w/n": np.array(9)}
    out = clip_update(up, ref, max_norm=1.0)
    np.testing.assert_allclose(out["w/a"], [0.6, 0.8, 0.0, 0.0], rtol=1e-6)
    assert int(out["w/n"]) == 9  # integer buffers are not updates
    assert clip_update(up, ref, max_norm=10.0)["w/a"] is up["w/a"]  # within the bound: untouched
    np.testing.assert_allclose(
        clip_to_norm(np.array([0.0, 10.0]), np.array([0.0, 2.0]), 1.0), [0.0, 3.0]
    )


def test_prototype_table_with_a_median_ignores_a_flipped_prototype():
    table = PrototypeTable(2, 3)
    honest = [{0: np.array([1.0, 1.0, 1.0], np.float32) + 0.01 * i} for i in range(4)]
    attacker = [{0: np.array([-50.0, -50.0, -50.0], np.float32)}]
    table.aggregate(honest + attacker, Defences(aggregator="median"))
    assert np.abs(table.values[0] - 1.0).max() < 0.05
    plain = PrototypeTable(2, 3)
    plain.aggregate(honest + attacker)
    assert plain.values[0][0] < -5  # the mean follows the attacker


def test_defences_are_options_of_fedavg_fedprox_and_fedproto():
    for name in ("fedavg", "fedprox", "fedproto"):
        opts = get_algorithm(name).parse_options(
            {"aggregator": "trimmed_mean", "trim": "0.1", "clip_norm": "5"}
        )
        assert (opts.aggregator, opts.trim, opts.clip_norm) == ("trimmed_mean", 0.1, 5.0)
    with pytest.raises(ConfigError, match="aggregator"):
        get_algorithm("fedavg").parse_options({"aggregator": "mode"})
    with pytest.raises(ConfigError, match="trim"):
        get_algorithm("fedavg").parse_options({"trim": "0.5"})


def _knowledge_server(options):
    from edgefl.algorithms.felo import FedHeServer
    from tests.felo_cases import server_ctx

    return FedHeServer(server_ctx(["10"] * 10), options)


def _logit_uploads(c, attacked):
    """Ten uploads of per-class logits that peak on their own class; the first ``attacked`` claim a
    huge count and put class y's mass on class y+1 (a label flip through distillation)."""
    rng = np.random.default_rng(0)
    out = {}
    for i in range(10):
        logit = (5.0 * np.eye(c) + rng.normal(0, 0.1, (c, c))).astype(np.float32)
        count = np.full(c, 10, np.int64)
        if i < attacked:
            logit, count = (
                (50.0 * np.roll(np.eye(c), 1, axis=1)).astype(np.float32),
                np.full(c, 10**6, np.int64),
            )
        out[f"d{i:02d}"] = Payload(
            {"logit": logit, "count": count}, {"num_samples": int(count.sum())}
        )
    return out


@pytest.mark.parametrize(
    "options",
    [{"aggregator": "median"}, {"aggregator": "trimmed_mean", "trim": 0.2}, {"clip_norm": 1.0}],
)
def test_fedhe_defences_keep_two_of_ten_label_flippers_out_of_the_class_logits(options):
    from edgefl.algorithms.felo import FedHeOptions

    plain = _knowledge_server(FedHeOptions())
    plain.aggregate(0, _logit_uploads(C, attacked=2))
    # the mean follows the attackers
    assert (plain.knowledge()["logit"].argmax(1) == np.roll(np.arange(C), -1)).all()
    defended = _knowledge_server(FedHeOptions(**options))
    if "clip_norm" in options:  # a bound on each round's step: a clean round, then an attacked one
        defended.aggregate(0, _logit_uploads(C, attacked=0))
        before = defended.knowledge()["logit"]
        defended.aggregate(1, _logit_uploads(C, attacked=2))
        step = np.linalg.norm(defended.knowledge()["logit"] - before, axis=1)
        assert step.max() <= options["clip_norm"] * (1 + 1e-5)  # even with a claimed count of 10⁶
        assert step.max() > 0.5 * options["clip_norm"]  # (and the attackers did push)
        return
    for r in range(3):
        defended.aggregate(r, _logit_uploads(C, attacked=2))
    logit = defended.knowledge()["logit"]
    assert (logit.argmax(1) == np.arange(C)).all()  # every class still teaches its own label
    assert np.isfinite(logit).all()


def test_felo_clip_bounds_features_and_weights_too():
    from edgefl.algorithms.felo import FeloOptions, FeloServer
    from tests.felo_cases import server_ctx

    server = FeloServer(server_ctx(["10", "10"]), FeloOptions(clip_norm=1.0))
    d = server.feature_dim
    arch = next(iter(server.weights))
    start = {k: v.copy() for k, v in server.weights[arch].items()}
    far = {k: (v + 100.0 if v.dtype.kind == "f" else v) for k, v in start.items()}
    ups = {
        f"d0{i}": Payload(
            {
                "logit": np.zeros((C, C), np.float32),
                "count": np.ones(C, np.int64),
                "feat": np.full((C, d), 100.0, np.float32),
                **far,
            },
            {"num_samples": 10},
        )
        for i in range(2)
    }
    server.aggregate(0, ups)
    feat = server.knowledge()["feat"]
    # clipped from its own norm (no class value yet)
    assert np.linalg.norm(feat, axis=1).max() == pytest.approx(1.0, rel=1e-4)
    moved = np.sqrt(
        sum(
            float(np.sum((server.weights[arch][k] - start[k]) ** 2))
            for k in start
            if start[k].dtype.kind == "f"
        )
    )
    assert moved == pytest.approx(1.0, rel=1e-4)


def test_defences_are_options_of_the_knowledge_methods():
    for name in ("fedhe", "felo", "velo"):
        opts = get_algorithm(name).parse_options({"aggregator": "median", "clip_norm": "2"})
        assert (opts.aggregator, opts.clip_norm) == ("median", 2.0)
