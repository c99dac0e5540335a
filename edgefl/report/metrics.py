"""The fleet status as Prometheus metrics (``prometheus-client``, in the [server] extra).

    registry = status_registry(source)          # source() -> the latest status snapshot or None
    start_http_server(9100, "127.0.0.1", registry=registry)   # edgefl server start --metrics-port
    generate_latest(registry)                   # the dashboard's /metrics

Collected at scrape time from the snapshot (:mod:`edgefl.runtime.status`), so the numbers are the
ones ``fleet status`` and the dashboard show:

========================================  =======  ==============================================
``edgefl_devices{state}``                 gauge    devices by state (training, idle, late, gone)
``edgefl_run_phase{phase}``               gauge    1 for the run's phase (waiting, train, …,
                                                   finished)
``edgefl_round`` / ``edgefl_rounds``      gauge    the round in progress / the rounds of the run
``edgefl_devices_registered`` /           gauge    while waiting: ready devices / the start
  ``_expected``                                    threshold
``edgefl_accuracy{tier}``                 gauge    each tier's accuracy at the last evaluation (0-1)
``edgefl_mean_accuracy``                  gauge    the mean over devices at the last evaluation
``edgefl_result_accuracy``                gauge    the run's final mean accuracy, once known
``edgefl_bytes_total{direction}``         counter  bytes up (device → server) and down, all devices
``edgefl_refused_messages_total``         counter  invalid replies refused, all devices
``edgefl_status_age_seconds``             gauge    seconds since the server wrote the snapshot
========================================  =======  ==============================================
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

STATES = ("training", "idle", "late", "gone")
PHASES = ("waiting", "train", "evaluate", "finish", "finished", "interrupted", "stopped")


class StatusCollector:
    """A prometheus-client collector over a status source."""

    def __init__(self, source: Callable[[], dict[str, Any] | None]):
        self.source = source

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snap = self.source() or {}
        server = snap.get("server") or {}
        devices = snap.get("devices") or {}
        states = GaugeMetricFamily("edgefl_devices", "Devices by state.", labels=["state"])
        counts = dict.fromkeys(STATES, 0)
        for d in devices.values():
            state = d.get("state")
            if state in counts:
                counts[state] += 1
        for state, n in counts.items():
            states.add_metric([state], n)
        yield states
        phase = GaugeMetricFamily(
            "edgefl_run_phase", "1 for the run's current phase.", labels=["phase"]
        )
        current = server.get("phase")
        for p in PHASES + ((current,) if current and current not in PHASES else ()):
            phase.add_metric([p], 1.0 if p == current else 0.0)
        yield phase
        for name, key, doc in (
            ("edgefl_round", "round", "The round in progress."),
            ("edgefl_rounds", "rounds", "Training rounds of the run."),
            (
                "edgefl_devices_registered",
                "registered",
                "Ready devices while the server waits for them.",
            ),
            (
                "edgefl_devices_expected",
                "expected",
                "Devices the server waits for before the first round.",
            ),
        ):
            if isinstance(server.get(key), (int, float)):
                yield GaugeMetricFamily(name, doc, value=float(server[key]))
        tiers = GaugeMetricFamily(
            "edgefl_accuracy",
            "Accuracy per tier at the last evaluation (device-reported, 0-1).",
            labels=["tier"],
        )
        for tier, acc in sorted((snap.get("tier_accuracy") or {}).items()):
            if isinstance(acc, (int, float)):
                tiers.add_metric([str(tier)], float(acc))
        yield tiers
        last = next(
            (
                h
                for h in reversed(snap.get("history") or [])
                if isinstance(h.get("mean_accuracy"), (int, float))
            ),
            None,
        )
        if last is not None:
            yield GaugeMetricFamily(
                "edgefl_mean_accuracy",
                "Mean accuracy over devices at the last evaluation (device-reported, 0-1).",
                value=float(last["mean_accuracy"]),
            )
        result = snap.get("result") or server.get("result") or {}
        if isinstance(result.get("mean_accuracy"), (int, float)):
            yield GaugeMetricFamily(
                "edgefl_result_accuracy",
                "The run's final mean accuracy (0-1).",
                value=float(result["mean_accuracy"]),
            )
        traffic = CounterMetricFamily(
            "edgefl_bytes",
            "Bytes exchanged with the devices since the run started.",
            labels=["direction"],
        )
        traffic.add_metric(["up"], float(sum(d.get("bytes_up") or 0 for d in devices.values())))
        traffic.add_metric(["down"], float(sum(d.get("bytes_down") or 0 for d in devices.values())))
        yield traffic
        yield CounterMetricFamily(
            "edgefl_refused_messages",
            "Invalid replies refused since the run started.",
            value=float(sum(d.get("rejected") or 0 for d in devices.values())),
        )
        if isinstance(snap.get("time"), (int, float)):
            yield GaugeMetricFamily(
                "edgefl_status_age_seconds",
                "Seconds since the server wrote this status.",
                value=max(0.0, time.time() - float(snap["time"])),
            )


def status_registry(source: Callable[[], dict[str, Any] | None]):
    """A registry holding only the fleet's metrics (no process metrics of the reader)."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(source))
    return registry


def serve_metrics(source: Callable[[], dict[str, Any] | None], port: int, host: str = "127.0.0.1"):
    """Serve ``/metrics`` on ``host:port`` in a daemon thread; returns (server, thread)."""
    from prometheus_client import start_http_server

    return start_http_server(port, host, registry=status_registry(source))
