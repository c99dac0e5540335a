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


def _honest_and_attacker(scale):
    rng = np.random.default_rng(0)
    honest = [{"w/a": rng.normal(1.0, 0.1, size=(4, 3)).astype(np.float32), "w/n": np.array(5)} for _ in range(8)]
    attack = [{"w/a": np.full((4, 3), scale, np.float32), "w/n": np.array(5)} for _ in range(2)]
    return [(a, 10.0) for a in honest + attack]


@pytest.mark.parametrize("rule", ["median", "trimmed_mean"])
def test_robust_rules_keep_two_of_ten_attackers_from_moving_the_weights(rule):
    items = _honest_and_attacker(1e6)
    mean = robust_average(items, "mean")["w/a"]
    robust = robust_average(items, rule, trim=0.2)
    assert np.abs(mean - 1.0).min() > 1e4  # the plain mean is dragged away
    assert np.abs(robust["w/a"] - 1.0).max() < 0.2  # the robust rule stays with the honest eight
    assert robust["w/a"].dtype == np.float32 and robust["w/n"].dtype == np.int64 and int(robust["w/n"]) == 5


def test_trimmed_mean_drops_the_share_at_each_end():
    values = [np.array([v], np.float64) for v in (0.0, 1.0, 2.0, 3.0, 100.0)]
    assert robust_stack(values, "trimmed_mean", trim=0.2)[0] == pytest.approx(2.0)  # drops 0 and 100
    assert robust_stack(values, "median")[0] == 2.0


def test_clip_update_bounds_the_distance_from_the_global_model():
    ref = {"w/a": np.zeros(4, np.float32), "w/n": np.array(1)}
    up = {"w/a": np.array([3.0, 4.0, 0.0, 0.0], np.float32), "w/n": np.array(9)}
    out = clip_update(up, ref, max_norm=1.0)
    np.testing.assert_allclose(out["w/a"], [0.6, 0.8, 0.0, 0.0], rtol=1e-6)
    assert int(out["w/n"]) == 9  # integer buffers are not updates
    assert clip_update(up, ref, max_norm=10.0)["w/a"] is up["w/a"]  # within the bound: untouched
    np.testing.assert_allclose(clip_to_norm(np.array([0.0, 10.0]), np.array([0.0, 2.0]), 1.0), [0.0, 3.0])


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
        opts = get_algorithm(name).parse_options({"aggregator": "trimmed_mean", "trim": "0.1", "clip_norm": "5"})
        assert (opts.aggregator, opts.trim, opts.clip_norm) == ("trimmed_mean", 0.1, 5.0)
    with pytest.raises(ConfigError, match="aggregator"):
        get_algorithm("fedavg").parse_options({"aggregator": "mode"})
    with pytest.raises(ConfigError, match="trim"):
        get_algorithm("fedavg").parse_options({"trim": "0.5"})
