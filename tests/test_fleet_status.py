"""The server's fleet status: device states from exchanges, misses and lost connections."""

import json

from edgefl.runtime.status import FleetStatus, StatusPublisher
from edgefl.runtime.status_read import merge_active, read_status_from_run
from edgefl.transport.base import Delivery


def fleet(**kw):
    s = FleetStatus("lab", run_name="r", algorithm="fedavg", rounds=3, deadline=10.0, **kw)
    for d in ("d00", "d01"):
        s.registered(
            d,
            "w0.25",
            "cnn2-w0.25",
            {"name": "pi", "arch": "aarch64", "cores": 4, "ram_total_mb": 4096, "secret": "x"},
        )
    return s


def states(s):
    return {d: v["state"] for d, v in s.snapshot()["devices"].items()}


def test_training_idle_late_and_gone_follow_the_exchanges(monkeypatch):
    s = fleet()
    replied = set()
    s.replied = lambda d: d in replied
    assert states(s) == {"d00": "idle", "d01": "idle"}
    s.exchange_started("train", 0, ["d00", "d01"], timeout=10.0)
    assert states(s) == {"d00": "training", "d01": "training"}
    replied.add("d00")
    assert states(s) == {"d00": "idle", "d01": "training"}
    s.exchange_deadline -= 11  # the deadline passes with d01 silent
    assert states(s)["d01"] == "late"
    s.exchange_done(
        "train",
        0,
        {"d00": Delivery("d00", b"x" * 7), "d01": Delivery("d01", None, "deadline")},
        {"d00": 5, "d01": 5},
    )
    snap = s.snapshot()
    assert (
        snap["devices"]["d00"]["last_round"] == 0 and snap["devices"]["d01"]["last_round"] is None
    )
    assert snap["devices"]["d00"]["bytes_up"] == 7 and snap["devices"]["d01"]["bytes_down"] == 5
    assert states(s) == {"d00": "idle", "d01": "late"}
    s.exchange_started("evaluate", 1, ["d00", "d01"], timeout=10.0)
    s.exchange_done(
        "evaluate", 1, {"d00": Delivery("d00", b"m"), "d01": Delivery("d01", None, "deadline")}, {}
    )
    assert states(s) == {"d00": "idle", "d01": "gone"}  # two misses in a row
    assert snap["devices"]["d00"]["profile"] == {
        "name": "pi",
        "arch": "aarch64",
        "cores": 4,
        "ram_total_mb": 4096,
    }


def test_a_lost_connection_is_late_then_gone_after_the_grace(monkeypatch):
    import edgefl.runtime.status as status_module

    now = [1000.0]
    monkeypatch.setattr(status_module.time, "time", lambda: now[0])
    s = fleet(gone_after=4.0)
    s.connection = lambda d: "offline" if d == "d01" else "online"
    assert states(s) == {"d00": "idle", "d01": "late"}
    now[0] += 3.9
    assert states(s)["d01"] == "late"
    now[0] += 0.2
    assert states(s)["d01"] == "gone"
    s.connection = lambda d: "online"  # it came back
    assert states(s)["d01"] == "idle"


def test_a_device_without_a_connection_when_the_run_is_over_is_gone_at_once(monkeypatch):
    import edgefl.runtime.status as status_module

    now = [1000.0]
    monkeypatch.setattr(status_module.time, "time", lambda: now[0])
    s = fleet(gone_after=4.0)
    s.connection = lambda d: "offline" if d == "d01" else "online"
    assert states(s)["d01"] == "late"  # within the grace while the run goes on
    # Execute: the run ends within the grace (a dropped device no longer holds its round)
    s.finished()
    # Assert: the last status says what it is: nothing will wait for it to come back
    assert states(s) == {"d00": "idle", "d01": "gone"}


def test_accuracy_per_tier_history_and_the_run_directory_copy(tmp_path):
    s = fleet()
    s.round_recorded(
        {
            "round": 0,
            "completed": ["d00"],
            "failed": {"d01": "x"},
            "bytes_up_total": 10,
            "bytes_down_total": 20,
            "eval": {"mean_accuracy": 0.5, "tier_accuracy": {"w0.25": 0.5, "w0.5": float("nan")}},
        }
    )
    s.round_recorded(
        {
            "round": 1,
            "completed": ["d00", "d01"],
            "failed": {},
            "bytes_up_total": 11,
            "bytes_down_total": 21,
        }
    )
    StatusPublisher(s, None, tmp_path).publish_now()
    snap = read_status_from_run(tmp_path)
    # the last evaluation; NaN is not JSON
    assert snap["tier_accuracy"] == {"w0.25": 0.5, "w0.5": None}
    assert [h["round"] for h in snap["history"]] == [0, 1] and snap["history"][1]["bytes_up"] == 11
    merged = merge_active(
        json.loads(json.dumps(snap)),
        {"d00": {"version": "v2", "digest": "ab"}, "d09": {"version": "v1"}},
    )
    assert (
        merged["devices"]["d00"]["model_version"] == "v2"
        and merged["devices"]["d09"]["model_version"] == "v1"
    )


def test_an_unchanged_status_is_published_once_per_heartbeat(tmp_path):
    s = fleet()
    sent = []
    publisher = StatusPublisher(s, sent.append, None, heartbeat=3600)
    publisher.publish_now(force=False)
    publisher.publish_now(force=False)  # nothing changed (only the time)
    assert len(sent) == 1
    s.exchange_started("train", 0, ["d00"], timeout=10.0)
    publisher.publish_now(force=False)
    assert len(sent) == 2 and json.loads(sent[-1])["devices"]["d00"]["state"] == "training"


def test_the_phase_goes_from_waiting_to_a_terminal_one_with_the_result():
    from edgefl.runtime.status import display_round, result_of

    s = fleet()
    s.waiting(1, 3)
    server = s.snapshot()["server"]
    assert (server["phase"], server["registered"], server["expected"], server["result"]) == (
        "waiting",
        1,
        3,
        None,
    )
    # the evaluation after round 1
    assert display_round("train", 0) == 1 and display_round("evaluate", 1) == 1
    s.exchange_started("train", display_round("train", 0), ["d00"], timeout=10.0)
    assert s.snapshot()["server"]["round"] == 1 and s.snapshot()["server"]["phase"] == "train"
    s.exchange_started("evaluate", 3, ["d00"], timeout=10.0, final=True)
    assert s.snapshot()["server"]["final_evaluation"] is True
    summary = {
        "mean_accuracy": 0.7,
        "client_accuracy": {"d00": 0.8, "d01": 0.6},
        "measured_by": "mixed",
        "tier_accuracy": {"w0.25": 0.7},
        "accuracy_from_round": {"d01": 2},
        "rounds_completed": 3,
    }
    s.finished({"mean_accuracy": 0.7, "tier_accuracy": {"w0.25": 0.7}}, result_of(summary))
    server = s.snapshot()["server"]
    assert server["phase"] == "finished" and server["final_evaluation"] is False
    assert server["result"] == {
        "mean_accuracy": 0.7,
        "devices": 2,
        "measured_by": "mixed",
        "tier_accuracy": {"w0.25": 0.7},
        "from_last_round": {"d01": 2},
        "rounds_completed": 3,
    }
    s2 = fleet()
    s2.finished(
        None, result_of({"mean_accuracy": float("nan"), "client_accuracy": {}}), phase="interrupted"
    )
    assert (
        s2.snapshot()["server"]["phase"] == "interrupted"
        and s2.snapshot()["server"]["result"]["mean_accuracy"] is None
    )
    try:
        s2.finished(None, phase="done")
    except ValueError as e:
        assert "terminal" in str(e)
    else:
        raise AssertionError("an unknown terminal phase was accepted")


def test_a_server_gone_mid_run_reads_as_stopped_and_a_finished_run_stays_finished():
    s = fleet()
    s.epoch = "e1"
    s.exchange_started("train", 2, ["d00"], timeout=10.0)
    snap = json.loads(json.dumps(s.snapshot()))
    live = merge_active(json.loads(json.dumps(snap)), {}, {"state": "online", "epoch": "e1"})
    assert live["server"]["phase"] == "train" and live["server"]["connection"] == "online"
    will = merge_active(
        json.loads(json.dumps(snap)), {}, {"state": "offline", "epoch": "e1", "phase": "stopped"}
    )
    assert will["server"]["phase"] == "stopped"
    other_run = merge_active(
        json.loads(json.dumps(snap)), {}, {"state": "offline", "epoch": "e0", "phase": "stopped"}
    )
    # an earlier server's will says nothing of this run
    assert other_run["server"]["phase"] == "train"
    s.finished(None)
    done = merge_active(
        json.loads(json.dumps(s.snapshot())),
        {},
        {"state": "offline", "epoch": "e1", "phase": "finished"},
    )
    assert done["server"]["phase"] == "finished"


def test_fleet_status_shows_waiting_and_the_result_in_words(capsys):
    from edgefl.cli.fleet import render, result_line

    s = fleet()
    s.waiting(2, 6)
    render(json.loads(json.dumps(s.snapshot())))
    assert "waiting for devices: 2 of 6 registered" in capsys.readouterr().out
    s.finished(
        None,
        {
            "mean_accuracy": 0.713,
            "devices": 3,
            "measured_by": "final-evaluation",
            "rounds_completed": 3,
        },
    )
    render(json.loads(json.dumps(s.snapshot())))
    text = capsys.readouterr().out
    assert (
        "finished" in text
        and "result: 71.3% mean accuracy over 3 devices (final evaluation)" in text
    )
    assert "nan" not in result_line({"mean_accuracy": None, "devices": 0, "rounds_completed": 2})
