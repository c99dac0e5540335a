"""Asynchronous buffered aggregation (edgefl.runtime.buffered, FedBuff) as a mode of the round loop:
the staleness rebase by hand, one update per device per buffer of K, the simulated clock, and the
refusals (methods that cannot, in memory and over MQTT; parallel workers). Over MQTT:
tests/test_conformance_async.py."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from edgefl.errors import ConfigError
from edgefl.runtime.buffered import rebase, staleness_weight
from edgefl.wire import Payload
from tests.conftest import tiny_config


def test_staleness_weight_is_fedbuffs_polynomial():
    assert [staleness_weight(t) for t in (0, 1, 3)] == pytest.approx([1.0, 1 / math.sqrt(2), 0.5])


def test_a_stale_update_is_rebased_onto_the_current_model_by_hand():
    received = Payload({"w/a": np.array([1.0, 2.0], np.float32), "w/n": np.array(3)})
    current = Payload({"w/a": np.array([2.0, 2.0], np.float32), "w/n": np.array(5)})
    update = Payload(
        {
            "w/a": np.array([1.5, 3.0], np.float32),
            "w/n": np.array(4),
            "sl/sums": np.ones(2, np.float32),
        },
        {"num_samples": 7},
    )
    # Execute: staleness 3, s = 1/√4 = 0.5
    out = rebase(update, received, current, 3)
    # Assert: current + 0.5·(update − received) for the shared float weights; the rest as sent
    np.testing.assert_allclose(out.arrays["w/a"], [2.0 + 0.5 * 0.5, 2.0 + 0.5 * 1.0])
    assert out.arrays["w/n"] == 4 and out.arrays["sl/sums"] is update.arrays["sl/sums"]
    assert out.meta == {"num_samples": 7}
    assert rebase(update, received, current, 0) is update  # a fresh update is used as sent


def final(tmp_path, name, **overrides):
    from edgefl.runtime.simulation import simulate

    box = {}
    cfg = tiny_config(tmp_path, run_name=name, eval_every=0, **overrides)
    summary = simulate(cfg, plots=False, on_done=lambda s: box.__setitem__("state", s.state_dict()))
    rounds = [
        json.loads(line) for line in (tmp_path / name / "rounds.jsonl").read_text().splitlines()
    ]
    return box["state"], rounds, summary


def test_one_device_with_a_buffer_of_one_is_synchronous_fedavg(tmp_path):
    # Prepare / Execute: nothing is ever stale with one device that pulls after each aggregation
    sync, _, _ = final(tmp_path, "sync", clients=1, rounds=3)
    state, rounds, _ = final(tmp_path, "async", clients=1, rounds=3, aggregation="async", buffer=1)
    # Assert
    assert [r["buffered"]["staleness"] for r in rounds] == [{"d00": 0}] * 3
    for k in sync:
        np.testing.assert_allclose(
            np.asarray(state[k], np.float64), np.asarray(sync[k], np.float64), atol=1e-6, err_msg=k
        )


def test_every_aggregation_takes_k_arrivals_with_their_staleness(tmp_path):
    # Prepare: 4 devices of different shard sizes (Dirichlet), one local epoch: different durations
    state, rounds, summary = final(
        tmp_path,
        "async",
        clients=4,
        rounds=6,
        aggregation="async",
        buffer=2,
        partition="dirichlet",
        alpha=0.5,
        steps=None,
        epochs=1,
    )
    # Assert: two updates per aggregation, each from another device; staleness counts the
    # aggregations since the model it trained on; the clock never runs back
    assert [len(r["completed"]) for r in rounds] == [2] * 6
    assert all(len(set(r["completed"])) == 2 for r in rounds)
    stale = [t for r in rounds for t in r["buffered"]["staleness"].values()]
    assert min(stale) >= 0 and max(stale) >= 1 and max(stale) <= 5
    clocks = [r["buffered"]["clock"] for r in rounds]
    assert clocks == sorted(clocks) and clocks[-1] > 0
    for r in rounds:
        for d, t in r["buffered"]["staleness"].items():
            assert r["buffered"]["staleness_weight"][d] == pytest.approx(1 / math.sqrt(1 + t))
    # a number: every device was evaluated
    assert summary["mean_accuracy"] == summary["mean_accuracy"]
    assert set(summary["client_accuracy"]) == {"d00", "d01", "d02", "d03"}


def test_what_cannot_run_asynchronously_is_refused(tmp_path):
    from edgefl.runtime.server import ServeOptions, serve
    from edgefl.runtime.setup import assemble
    from edgefl.runtime.simulation import simulate

    with pytest.raises(ConfigError, match="cannot aggregate updates as they arrive"):
        assemble(tiny_config(tmp_path, algorithm="fedproto", aggregation="async"))
    # the ledger counts synchronous rounds
    with pytest.raises(ConfigError, match="with --dp central is not supported"):
        options = {"dp": "central", "dp_noise_multiplier": "1.0"}
        assemble(tiny_config(tmp_path, aggregation="async", options=options))
    with pytest.raises(ConfigError, match="leave --workers at 1"):
        simulate(tiny_config(tmp_path, aggregation="async"), workers=2)
    # over MQTT too, before any broker is reached
    with pytest.raises(ConfigError, match="cannot aggregate updates as they arrive"):
        serve(tiny_config(tmp_path, algorithm="fedproto", aggregation="async"),
              ServeOptions(broker="mqtt://127.0.0.1:1", fleet="x"))
    with pytest.raises(ConfigError, match="would never fill"):
        tiny_config(tmp_path, aggregation="async", buffer=4)  # 3 devices
    with pytest.raises(ConfigError, match="give aggregation=async"):
        tiny_config(tmp_path, buffer=2)


def test_the_cli_runs_an_asynchronous_simulation(tmp_path):
    from typer.testing import CliRunner

    from edgefl.cli.main import app

    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "--dataset",
            "synthetic",
            "--clients",
            "3",
            "--rounds",
            "2",
            "--steps",
            "2",
            "--width",
            "0.25",
            "--train-samples",
            "300",
            "--test-samples",
            "50",
            "--eval-samples",
            "50",
            "--aggregation",
            "async",
            "--buffer",
            "2",
            "--out",
            str(tmp_path),
            "--run-name",
            "cli",
            "--quiet",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    rounds = [
        json.loads(line) for line in (tmp_path / "cli" / "rounds.jsonl").read_text().splitlines()
    ]
    assert [len(r["buffered"]["staleness"]) for r in rounds] == [2, 2]
