"""The link check's comparison (links.py): each MQTT round against the fleet clock's model of the
same round, and its page.

For every compared round the clock (:class:`~edgefl.runtime.clock.FleetClock`: the simulator's
timelines and durations) is asked what happens in a round that starts when the MQTT round
started (seconds since the timelines started): who is online then (selected), when each selected
device's update arrives (its simulated seconds) or when it goes offline first (dropped), and when
the round ends (the last of these). The MQTT server's record says what happened: each reply's
send→reply seconds less the device's real training seconds (``--delay`` emulates the modelled
compute; the real training is this machine's, not the fleet's), each failure's seconds ("device
went offline N s after the request was sent"), the round's length (the last of these). Rounds
are compared from the measured start so that one round's error does not shift the next; the
whole run is compared too (the clock run alone from 0 over as many rounds, against the measured
end of the last round).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from benchmarks.common import table
from edgefl.runtime.clock import FleetClock

GONE = re.compile(r"device went offline ([0-9.]+) s after the request was sent")


def clock_round(clock: FleetClock, devices: list[str], duration: Mapping[str, float],
                start: float) -> dict[str, Any]:
    """The clock's synchronous round from ``start`` (FleetClock.select, then flight's rule: an
    update arrives if its device is still online when its local work ends)."""
    clock.now = start
    selected, timing = clock.select(sorted(devices))
    start = timing["start"]
    out: dict[str, dict[str, Any]] = {}
    for d in selected:
        leaves = clock.timelines[d].online_until(start)
        if start + duration[d] <= leaves:
            out[d] = {"outcome": "arrived", "seconds": duration[d]}
        else:
            out[d] = {"outcome": "offline", "seconds": leaves - start}
    length = max((x["seconds"] for x in out.values()), default=0.0)
    return {"start": start, "selected": selected, "devices": out, "length": length}


def measured_round(rq: Mapping[str, Any]) -> dict[str, Any]:
    """What the MQTT server recorded of a round: per device, its outcome and seconds."""
    out: dict[str, dict[str, Any]] = {}
    for d in rq["selected"]:
        if d in rq["reply_seconds"]:
            train = rq["train_seconds"].get(d, 0.0)
            out[d] = {"outcome": "arrived", "seconds": rq["reply_seconds"][d] - train,
                      "reply_seconds": rq["reply_seconds"][d], "train_seconds": train}
        else:
            reason = str(rq["failed"].get(d, "no reply"))
            m = GONE.search(reason)
            out[d] = {"outcome": "offline" if m else "failed",
                      "seconds": float(m.group(1)) if m else None, "reason": reason}
    length = max((x["seconds"] or 0.0 for x in out.values()), default=0.0)
    return {"selected": list(rq["selected"]), "devices": out, "length": length}


def err(measured: float | None, simulated: float) -> float | None:
    if measured is None or simulated <= 0:
        return None
    return measured / simulated - 1.0


def compare(clock: FleetClock, devices: list[str], duration: Mapping[str, float],
            mqtt: list[dict[str, Any]], starts: Mapping[int, float],
            ends: Mapping[int, float]) -> dict[str, Any]:
    """Rows per device and round, rounds, and the whole run (see the module)."""
    rows, rounds = [], []
    for rq in mqtt:
        r = rq["round"]
        if r not in starts:
            continue
        sim = clock_round(clock, devices, duration, starts[r])
        got = measured_round(rq)
        for d in sorted(set(sim["devices"]) | set(got["devices"])):
            s = sim["devices"].get(d, {"outcome": "not selected", "seconds": None})
            m = got["devices"].get(d, {"outcome": "not selected", "seconds": None})
            same = s["outcome"] == m["outcome"]
            rows.append({
                "round": r, "device": d, "simulated": s, "measured": m, "agree": same,
                "error": err(m["seconds"], s["seconds"]) if same and s["seconds"] else None,
            })
        rounds.append({
            "round": r, "start": starts[r], "simulated_start": sim["start"],
            "selected": {"simulated": sim["selected"], "measured": got["selected"]},
            "length": {"simulated": sim["length"], "measured": got["length"]},
            "end_wall": ends.get(r),  # the round record's time (aggregation included)
            "error": err(got["length"], sim["length"]),
            "agree": sim["selected"] == got["selected"],
        })
    # the whole run: the clock alone from 0, as many rounds
    t = 0.0
    for _ in rounds:
        sim = clock_round(clock, devices, duration, t)
        t = sim["start"] + sim["length"]
    last = rounds[-1]["round"] if rounds else None
    measured_end = ends.get(last) if last is not None else None
    return {
        "rows": rows,
        "rounds": rounds,
        "run": {"simulated_seconds": t, "measured_seconds": measured_end,
                "error": err(measured_end, t)},
    }


def verdict(c: dict[str, Any], tolerance: float) -> dict[str, Any]:
    errors = [abs(x["error"]) for x in c["rows"] if x["error"] is not None]
    round_errors = [abs(x["error"]) for x in c["rounds"] if x["error"] is not None]
    mismatched = [f"round {x['round']} {x['device']}" for x in c["rows"] if not x["agree"]]
    worst = max(errors + round_errors, default=0.0)
    return {
        "max_abs_error": max(errors, default=None),
        "mean_abs_error": sum(errors) / len(errors) if errors else None,
        "max_abs_round_error": max(round_errors, default=None),
        "run_error": c["run"]["error"],
        "outcomes_differ": mismatched,
        "agrees": bool(errors) and not mismatched and worst <= tolerance,
    }


def method(r: dict[str, Any]) -> list[str]:
    """How the check runs, and how its latency differs from netem's (with the fleet's
    bandwidth-delay products)."""
    tcp, b = r["tcp"], r["bdp"]
    largest = max(max(x["down_bytes"], x["up_bytes"]) for x in b.values())
    products = "; ".join(
        f"{d} {x['down_bytes'] / 1e3:.1f} kB down, {x['up_bytes'] / 1e3:.1f} kB up "
        f"(RTT {1e3 * x['rtt_s']:.0f} ms)"
        for d, x in sorted(b.items())
    )
    return [
        "How: round 1 is a warm-up outside the clock (every device online; the first "
        "training's one-off costs paid); the devices' availability timelines (the FleetClock's "
        "for this fleet file and the run seed) start when it ends, and the next "
        f"{len(r['comparison']['rounds'])} rounds are compared. Each round's clock is the "
        "FleetClock's round started when the MQTT round started: the devices online then are "
        "selected, an update arrives after the device's simulated seconds unless its timeline "
        "goes offline first (then it is dropped then), the round ends at the last of these. "
        "Measured: the MQTT server's send→reply seconds less the device's real training "
        "seconds (`--delay` emulates the modelled compute), or for a device that went offline "
        "the seconds after which the server failed its request (its Last Will). The proxy of "
        "each device cuts its connections when its timeline goes offline (the broker publishes "
        "its Last Will at once) and holds new ones until it is back (a handshake on a dead "
        "link); the device's MQTT client reconnects by itself and says \"online\" again.",
        "",
        "Latency without netem: the proxy delays the bytes each way by the declared one-way "
        "latency, in order, at the application level, and tbf shapes the rate on the veth. "
        "Unlike netem it does not delay TCP's own packets: the device's handshake and ACKs "
        "cross the veth at once, so TCP's congestion and flow control see no round trip. That "
        "changes a transfer's time only where a sender would be window-limited, i.e. where the "
        "bandwidth-delay product exceeds what TCP may have in flight. Here it does not: "
        f"{products}; the largest, {largest / 1e3:.1f} kB, is below TCP's initial window "
        f"({tcp['initial_cwnd_bytes'] / 1e3:.1f} kB: 10 segments) and far below the receive "
        f"buffer a connection starts with ({tcp['rmem_default_bytes'] / 1e3:.0f} kB, "
        "net.ipv4.tcp_rmem), so with netem a transfer too would take latency + bytes / rate, "
        "the clock's charge. MQTT's own round trips (CONNECT/CONNACK, PUBLISH/PUBACK, the "
        "request/ack protocol) are application bytes: the proxy delays them as netem would.",
    ]


def _s(x: dict[str, Any]) -> str:
    if x["outcome"] == "not selected":
        return "not selected"
    if x["seconds"] is None:
        return x["outcome"]
    return f"{x['seconds']:.2f}" + (" (offline)" if x["outcome"] == "offline" else "")


def _pct(e: float | None) -> str:
    return "—" if e is None else f"{100 * e:+.1f} %"


DEVICE_COLUMNS = ("round", "start s", "device", "clock s", "measured s", "reply s", "train s",
                  "error")
ROUND_COLUMNS = ("round", "start s", "selected (clock / MQTT)", "clock s", "measured s", "error")


def device_row(x: dict[str, Any], starts: Mapping[int, float]) -> tuple[str, ...]:
    """A device's round: when the round started, the clock's and the measured times, the error."""
    m = x["measured"]
    return (str(x["round"]), f"{starts[x['round']]:.1f}", x["device"], _s(x["simulated"]), _s(m),
            f"{m.get('reply_seconds', 0) or 0:.2f}", f"{m.get('train_seconds', 0):.2f}",
            _pct(x["error"]) + ("" if x["agree"] else " (outcome differs)"))


def round_row(x: dict[str, Any]) -> tuple[str, ...]:
    """A round: whom the clock and MQTT selected, its length on either, the error."""
    sel = x["selected"]
    return (str(x["round"]), f"{x['start']:.1f}",
            f"{', '.join(sel['simulated']) or '—'} / {', '.join(sel['measured']) or '—'}",
            f"{x['length']['simulated']:.2f}", f"{x['length']['measured']:.2f}", _pct(x["error"]))


def page(r: dict[str, Any]) -> str:
    v, c = r["verdict"], r["comparison"]
    head = "Agrees" if v["agrees"] else "Does not agree"
    worst = v["max_abs_error"]
    starts = {x["round"]: x["start"] for x in c["rounds"]}
    lines = [
        "# The simulated clock against shaped links with latency and churn (Mosquitto, one "
        "network namespace per device)",
        "",
        f"Fleet: [`{r['fleet']}`](links_fleet.yaml); shaping: {r['shaping']}; latency: "
        f"{r['latency']}; churn: {r['churn']}. Command: `{r['command']}` (as root). Load "
        f"(1/5/15 min): {r['machine']['before'].get('loadavg_1_5_15')} before, "
        f"{r['machine']['after'].get('loadavg_1_5_15')} after; wall {r['wall_seconds']:.0f} s.",
        "",
        f"**{head}** within {100 * r['tolerance']:.0f} %: per device and round, largest error "
        + (f"{100 * worst:.1f} %, mean {100 * v['mean_abs_error']:.1f} %" if worst is not None
           else "none measured")
        + "; round lengths, largest "
        + ("—" if v["max_abs_round_error"] is None else f"{100 * v['max_abs_round_error']:.1f} %")
        + f"; the whole run {_pct(v['run_error'])} ({c['run']['measured_seconds'] or 0:.1f} s "
        f"measured, {c['run']['simulated_seconds']:.1f} s on the clock from 0). "
        + (f"Outcomes that differ: {', '.join(v['outcomes_differ'])}." if v["outcomes_differ"]
           else "Every device's outcome (selected or not, update arrived or device went "
                "offline) is the clock's."),
        "",
        *method(r),
        "",
        *table(DEVICE_COLUMNS, (device_row(x, starts) for x in c["rows"])),
        "",
        "Rounds (length: from sending the model to the last update or drop; the clock's selection "
        "is the devices online at the measured start):",
        "",
        *table(ROUND_COLUMNS, map(round_row, c["rounds"])),
    ]
    lines += ["", "Availability as the proxies applied it (seconds since the timelines started; "
              "connections cut; \"connected\": a connection of the device reached the broker):",
              ""]
    for d, events in sorted(r["proxy_events"].items()):
        shown = ", ".join(f"{t:.1f} {what}" + (f" ({n} cut)" if n else "")
                          for t, what, n in events) or "online throughout"
        lines.append(f"- {d}: {shown}")
    return "\n".join(lines) + "\n"
