"""The fleet model and the simulated wall clock (edgefl.runtime.clock): a 3-device round computed
by hand, churn that is offline the declared fraction of the time, determinism, FedBuff's events in
time order, and the fleet file's declarations."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgefl.errors import ConfigError
from edgefl.profiling import read_fleet
from edgefl.profiling.fleet import Availability, Conditions, Link
from edgefl.runtime.clock import UPDATE_META_BYTES, FleetClock, Timeline, update_bytes
from edgefl.runtime.exchange import Exchange
from edgefl.wire import Envelope, Payload
from tests.conftest import tiny_config


def three_devices(deadline=None) -> FleetClock:
    """a: 8 Mbit/s down, 4 up, 10 ms, 2 s of compute, always on; b: no bandwidth limit, 100 ms,
    6 s; c: diurnal, a 100 s day online half of it, 47 s into the day at t=0 (offline at t=3)."""
    cond = {
        "a": Conditions(link=Link(down_mbps=8, up_mbps=4, latency_ms=10)),
        "b": Conditions(link=Link(latency_ms=100)),
        "c": Conditions(availability=Availability(kind="diurnal", period_s=100, on_fraction=0.5,
                                                  phase_s=47)),
    }
    return FleetClock(cond, {"a": 2.0, "b": 6.0, "c": 5.0}, seed=0, deadline=deadline)


def exchange(devices, down=1_000_000, up=500_000) -> Exchange:
    """Replies whose update costs ``up`` bytes on the simulated link (its arrays and the fixed
    header); the counted size is off by the few bytes a measured training time's digits add."""
    ex = Exchange()
    for d in devices:
        arrays = {"w": np.zeros(up - UPDATE_META_BYTES, np.uint8)}
        ex.replies[d] = Envelope("update", 0, d, payload=Payload(arrays))
        ex.bytes_down[d], ex.bytes_up[d] = down, up + 7
    return ex


def test_a_synchronous_round_on_three_devices_by_hand():
    clock = three_devices()
    # a: 0.01 + 1e6·8/8e6 (1 s) + 2 s + 0.01 + 5e5·8/4e6 (1 s) = 4.02 s; b: 0.1 + 6 + 0.1 = 6.2 s;
    # c would take 5 s but goes offline at t = 3 (50 − 47)
    assert clock.duration("a", 1_000_000, 500_000) == pytest.approx(4.02)
    assert clock.duration("b", 1_000_000, 500_000) == pytest.approx(6.2)
    selected, timing = clock.select(["a", "b", "c"])
    assert selected == ["a", "b", "c"] and timing["offline"] == []
    ex = exchange(selected)
    clock.settle(ex, timing)
    assert sorted(ex.replies) == ["a", "b"] and "went offline at 3.0 s" in ex.failed["c"]
    assert "c" not in ex.bytes_up
    assert timing["seconds"] == pytest.approx({"a": 4.02, "b": 6.2, "c": 5.0})
    assert timing["end"] == pytest.approx(6.2) and clock.now == pytest.approx(6.2)
    # the next round starts at 6.2: c is offline (back at 53 s) and not selected
    selected, timing = clock.select(["a", "b", "c"])
    assert selected == ["a", "b"] and timing == {"start": pytest.approx(6.2), "offline": ["c"]}
    assert clock.next_online("c", 6.2) == pytest.approx(53.0)


def test_an_update_costs_its_arrays_not_the_digits_of_its_measured_time():
    fast = Envelope("update", 0, "a", payload=Payload({"w": np.zeros(100, np.float32)},
                                                       {"train_seconds": 0.09123456789012345}))
    slow = Envelope("update", 0, "a", payload=Payload({"w": np.zeros(100, np.float32)},
                                                       {"train_seconds": 0.1}))
    assert update_bytes(fast) == update_bytes(slow) == 400 + UPDATE_META_BYTES


def test_the_deadline_ends_a_round_and_fails_who_missed_it():
    clock = three_devices(deadline=5.0)
    selected, timing = clock.select(["a", "b"])
    ex = exchange(selected)
    clock.settle(ex, timing)
    assert sorted(ex.replies) == ["a"] and "missed the 5 s deadline" in ex.failed["b"]
    assert clock.now == pytest.approx(5.0)


def test_the_clock_waits_for_a_device_when_none_is_online():
    clock = three_devices()
    clock.now = 10.0  # c is offline from 3 to 53
    selected, timing = clock.select(["c"])
    assert selected == ["c"] and timing["start"] == pytest.approx(53.0)


def test_churn_is_offline_the_declared_fraction_of_the_time():
    # Prepare: 200 devices, online spells of 140 s and offline spells of 60 s on average (30 %)
    a = Availability(kind="churn", mean_on_s=140, mean_off_s=60)
    timelines = [Timeline(a, seed=s) for s in range(200)]
    times = np.arange(0.0, 20_000.0, 25.0)
    # Execute
    offline = np.mean([[not t.online(x) for x in times] for t in timelines])
    spells = [e - s for t in timelines for s, e in zip(t._starts, t._ends, strict=True)]
    # Assert: 160,000 correlated samples over ~20,000 spells: the fraction within 2 points
    assert a.offline_fraction == pytest.approx(0.3)
    assert offline == pytest.approx(0.3, abs=0.02)
    assert np.mean(spells) == pytest.approx(140, rel=0.05)
    # at any single moment too (each device starts in its stationary state)
    assert np.mean([not t.online(0.0) for t in timelines]) == pytest.approx(0.3, abs=0.08)


def test_a_timeline_is_a_function_of_its_seed_whatever_is_asked_first():
    a = Availability(kind="churn", mean_on_s=10, mean_off_s=5)
    one, two = Timeline(a, seed=7), Timeline(a, seed=7)
    late = [two.online(t) for t in (500.0, 3.0, 250.0)]  # asked out of order
    assert late == [one.online(t) for t in (500.0, 3.0, 250.0)]
    assert one.next_online(100.0) == two.next_online(100.0)
    assert [Timeline(a, seed=8).online(t) for t in range(0, 300, 7)] != [
        one.online(t) for t in range(0, 300, 7)
    ]


PROFILE = ("{arch: x86_64, cpu_model: sim, cores: 1, ram_total_mb: 4096, ram_available_mb: 2048, "
           "train_gflops: 0.01}")
FLEET = """
clock:
  availability: {kind: churn, mean_on_s: 60, mean_off_s: 20}
devices:
  - {id: fast, profile: PROFILE, count: 2, link: {down_mbps: 10, latency_ms: 5}}
  - id: slow
    profile: PROFILE
    speed: 0.1
    link: {down_mbps: 1, up_mbps: 0.5, latency_ms: 100}
""".replace("PROFILE", PROFILE)


def run(tmp_path, name, **overrides):
    from edgefl.runtime.simulation import simulate

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    cfg = tiny_config(tmp_path, run_name=name, clients=3, model="cnn", tiers=("1",),
                      fleet_file=str(fleet), **overrides)
    summary = simulate(cfg, plots=False)
    lines = (tmp_path / name / "rounds.jsonl").read_text().splitlines()
    return summary, [json.loads(line) for line in lines]


def test_the_fleet_file_declares_each_devices_conditions(tmp_path):
    (tmp_path / "fleet.yaml").write_text(FLEET)
    fleet = read_fleet(tmp_path / "fleet.yaml")
    assert fleet.ids == ["fast-0", "fast-1", "slow"]
    assert fleet.conditions["slow"].speed == 0.1
    assert fleet.conditions["slow"].availability.mean_off_s == 20  # the clock section's default
    assert fleet.conditions["fast-0"].link == Link(down_mbps=10, latency_ms=5)
    bad = FLEET.replace("mean_off_s: 20", "mean_of_s: 20")
    (tmp_path / "bad.yaml").write_text(bad)
    with pytest.raises(ConfigError, match="mean_of_s"):
        read_fleet(tmp_path / "bad.yaml")
    (tmp_path / "bad.yaml").write_text(FLEET.replace("speed: 0.1", "speed: -1"))
    with pytest.raises(ConfigError, match="speed"):
        read_fleet(tmp_path / "bad.yaml")


def test_a_simulated_run_keeps_the_clock_and_repeats_it(tmp_path):
    summary, rounds = run(tmp_path, "one", rounds=6, eval_every=0)
    again, rounds2 = run(tmp_path, "two", rounds=6, eval_every=0)
    clocks = [r["simulated_seconds"] for r in rounds]
    assert clocks == [r["simulated_seconds"] for r in rounds2]
    assert [r["completed"] for r in rounds] == [r["completed"] for r in rounds2]
    assert all(b > a for a, b in zip(clocks, clocks[1:], strict=False))
    assert summary["simulated_seconds"] == again["simulated_seconds"] == clocks[-1]
    for r in rounds:  # a round ends at its slowest device that stayed online
        c = r["clock"]
        arrived = [c["seconds"][d] for d in r["completed"]]
        assert set(r["selected"]).isdisjoint(c["offline"])
        if not c["dropped"]:
            assert c["end"] - c["start"] == pytest.approx(max(arrived + [0.0]))
        assert c["end"] - c["start"] >= max(arrived + [0.0]) - 1e-9
    # this seed's churn: devices offline at a round's start, and one that left mid-round (its
    # update not aggregated, the round ending when it left, before its work would have been done)
    assert any(r["clock"]["offline"] for r in rounds)
    dropped = [(r, d) for r in rounds for d in r["clock"]["dropped"]]
    assert dropped
    for r, d in dropped:
        assert d in r["failed"] and d not in r["completed"]
        assert r["clock"]["end"] - r["clock"]["start"] < r["clock"]["seconds"][d]


def test_fedbuff_advances_on_the_simulated_clock_in_event_order(tmp_path):
    _, rounds = run(tmp_path, "async", rounds=12, eval_every=0, aggregation="async", buffer=1)
    clocks = [r["simulated_seconds"] for r in rounds]
    assert clocks == sorted(clocks)  # aggregations happen in time order
    assert clocks[0] > 0
    # the slow device (10x compute, 10x link) fills no buffer before the fast ones
    arrivals = [d for r in rounds for d in r["completed"]]
    assert arrivals.count("slow") < arrivals.count("fast-0") + arrivals.count("fast-1")
    # churn in flight: an update whose device went offline is lost (failed, not aggregated); the
    # device pulls the model again once it is back and a later update of it arrives
    lost = [(i, d) for i, r in enumerate(rounds) for d, why in r["failed"].items()
            if "went offline" in why]
    assert lost
    assert all(d not in rounds[i]["completed"] for i, d in lost)
    assert any(d in r["completed"] for i, d in lost for r in rounds[i + 1:])
    # the same run again: the same events
    _, again = run(tmp_path, "async2", rounds=12, eval_every=0, aggregation="async", buffer=1)
    assert [r["completed"] for r in again] == [r["completed"] for r in rounds]
    assert [r["simulated_seconds"] for r in again] == clocks
