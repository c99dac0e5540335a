"""The server's fleet status: device states from exchanges, misses and lost connections."""

import json

from edgefl.runtime.status import FleetStatus, StatusPublisher, merge_active, read_status_from_run
from edgefl.transport.base import Delivery


def fleet(**kw):
    s = FleetStatus("lab", run_name="r", algorithm="fedavg", rounds=3, deadline=10.0, **kw)
    for d in ("d00", "d01"):
        s.registered(d, "w0.25", "cnn2-w0.25", {"name": "pi", "arch": "aarch64", "cores": 4, "ram_total_mb": 4096, "secret": "x"})
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
    s.exchange_done("train", 0, {"d00": Delivery("d00", b"x" * 7), "d01": Delivery("d01", None, "deadline")}, {"d00": 5, "d01": 5})
    snap = s.snapshot()
    assert snap["devices"]["d00"]["last_round"] == 0 and snap["devices"]["d01"]["last_round"] is None
    assert snap["devices"]["d00"]["bytes_up"] == 7 and snap["devices"]["d01"]["bytes_down"] == 5
    assert states(s) == {"d00": "idle", "d01": "late"}
    s.exchange_started("evaluate", 1, ["d00", "d01"], timeout=10.0)
    s.exchange_done("evaluate", 1, {"d00": Delivery("d00", b"m"), "d01": Delivery("d01", None, "deadline")}, {})
    assert states(s) == {"d00": "idle", "d01": "gone"}  # two misses in a row
    assert snap["devices"]["d00"]["profile"] == {"name": "pi", "arch": "aarch64", "cores": 4, "ram_total_mb": 4096}


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


def test_accuracy_per_tier_history_and_the_run_directory_copy(tmp_path):
    s = fleet()
    s.round_recorded({"round": 0, "completed": ["d00"], "failed": {"d01": "x"}, "bytes_up_total": 10, "bytes_down_total": 20,
                      "eval": {"mean_accuracy": 0.5, "tier_accuracy": {"w0.25": 0.5, "w0.5": float("nan")}}})
    s.round_recorded({"round": 1, "completed": ["d00", "d01"], "failed": {}, "bytes_up_total": 11, "bytes_down_total": 21})
    StatusPublisher(s, None, tmp_path).publish_now()
    snap = read_status_from_run(tmp_path)
    assert snap["tier_accuracy"] == {"w0.25": 0.5, "w0.5": None}  # the last evaluation; NaN is not JSON
    assert [h["round"] for h in snap["history"]] == [0, 1] and snap["history"][1]["bytes_up"] == 11
    merged = merge_active(json.loads(json.dumps(snap)), {"d00": {"version": "v2", "digest": "ab"}, "d09": {"version": "v1"}})
    assert merged["devices"]["d00"]["model_version"] == "v2" and merged["devices"]["d09"]["model_version"] == "v1"


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
