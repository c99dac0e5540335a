"""The server's live view of its fleet, published as one retained JSON message.

    status = FleetStatus("lab", run_name="lab", algorithm="fedavg", rounds=50, deadline=120)
    publisher = StatusPublisher(status, publish=transport.publish_fleet_status,
                                run_dir=run_dir).start()

The server feeds :class:`FleetStatus` from registrations, the round loop's exchanges (through
:class:`ObservedTransport`, which wraps the server's transport) and the round records; every
``interval`` seconds :class:`StatusPublisher` publishes :meth:`FleetStatus.snapshot` retained on
``edgefl/<fleet>/server/fleet`` (devices cannot read it; the server and operator accounts can)
and writes ``status.json`` in the run directory. ``edgefl fleet status`` and ``edgefl dashboard``
read either (:mod:`edgefl.runtime.status_read`).

The run's ``phase`` (``server.phase``): ``waiting`` (for devices: ``registered`` of ``expected``
ready), ``train``, ``evaluate`` (per round and the final one, ``final_evaluation`` true),
``finish``, then one of the terminal phases: ``finished`` (a clean end), ``interrupted`` (Ctrl-C:
what the completed rounds produced is written) or ``stopped`` (the server went away mid-run: its
Last Will on ``server/status``, folded in by :func:`~edgefl.runtime.status_read.merge_active`).
Once known, ``server.result`` holds the run's result: ``{"mean_accuracy", "devices",
"measured_by", "tier_accuracy", "from_last_round", "rounds_completed"}``; ``measured_by`` is
``final-evaluation`` (every device answered the final evaluation), ``last-round`` (none did: each
device's last per-round evaluation stands in) or ``mixed``. Rounds are numbered from 1 everywhere
(``server.round``, ``last_round``, ``history``).

A device's state: ``training`` while a training request to it is open; ``late`` once an open
request's deadline passed, after it missed its last request, or when its connection was lost
(its Last Will) less than ``gone_after`` seconds ago (devices reconnect by themselves); ``gone``
after two missed requests in a row, ``gone_after`` seconds without a connection, or without one
when the run is over; else ``idle``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from edgefl.transport.base import Accept, Delivery, Transport
from edgefl.wire.validate import peek

log = logging.getLogger(__name__)

STATES = ("training", "idle", "late", "gone")
PHASES = ("waiting", "train", "evaluate", "finish", "finished", "interrupted", "stopped")
TERMINAL = ("finished", "interrupted", "stopped")
#: The profile fields shown (the rest stays in the run's config).
PROFILE_SUMMARY = ("name", "arch", "cores", "ram_total_mb", "accelerator")
HISTORY = 200  # rounds of accuracy and bytes kept in the status message


def profile_summary(profile: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: profile[k]
        for k in PROFILE_SUMMARY
        if k in profile and isinstance(profile[k], (str, int, float))
    }


class FleetStatus:
    """Thread-safe: registrations arrive on the network thread, exchanges on the loop's."""

    def __init__(self, fleet: str, *, run_name: str = "", algorithm: str = "", rounds: int = 0,
                 deadline: float | None = None,
                 gone_after_misses: int = 2, gone_after: float | None = None):
        self.lock = threading.Lock()
        self.fleet, self.run_name, self.algorithm, self.rounds, self.deadline = (
            fleet, run_name, algorithm, rounds, deadline)
        self.gone_after_misses = gone_after_misses
        self.gone_after = gone_after if gone_after is not None else (deadline or 60.0)
        self.offline_since: dict[str, float] = {}
        self.devices: dict[str, dict[str, Any]] = {}
        self.phase = "waiting"  # one of PHASES
        # from 1: the round training, or the rounds an evaluation follows
        self.round: int | None = None
        self.final_evaluation = False
        self.registered_count, self.expected = 0, 0  # ready devices, and how many the run waits for
        self.result: dict[str, Any] | None = None
        self.epoch = ""
        self.exchange_deadline: float | None = None  # wall-clock time the open exchange closes
        self.open: dict[str, str] = {}  # device → kind of its open request
        self.replied: Callable[[str], bool] = lambda device_id: False
        self.connection: Callable[[str], str] = lambda device_id: "unknown"
        self.last_seen: Callable[[str], float | None] = lambda device_id: None
        self.history: list[dict[str, Any]] = []
        # a run with differential privacy: mode, budget, δ
        self.privacy: dict[str, Any] | None = None
        self.started_at = time.time()
        self.version = 0  # bumped on every change; the publisher skips unchanged snapshots

    def _device(self, device_id: str) -> dict[str, Any]:
        return self.devices.setdefault(device_id, {
            "tier": None, "model": None, "profile": {}, "registered_at": None, "last_round": None,
            "bytes_up": 0, "bytes_down": 0, "misses": 0, "rounds_completed": 0, "rejected": 0,
        })

    # -- inputs ---------------------------------------------------------------------------------
    def registered(self, device_id: str, tier: str, model: str, profile: Mapping[str, Any]) -> None:
        with self.lock:
            d = self._device(device_id)
            if d["registered_at"] is None or d["tier"] != tier:
                d["registered_at"] = time.time()
            d.update(tier=tier, model=model, profile=profile_summary(profile), misses=0)
            self.version += 1

    def waiting(self, registered: int, expected: int) -> None:
        """Before the first round: ``registered`` of the ``expected`` devices are ready."""
        with self.lock:
            if (registered, expected) != (self.registered_count, self.expected):
                self.registered_count, self.expected = registered, expected
                self.version += 1

    def exchange_started(self, kind: str, round: int, device_ids: list[str], timeout: float | None,
                         final: bool = False) -> None:
        """``round`` numbered from 1 (:func:`display_round`)."""
        with self.lock:
            self.phase = kind if kind in ("evaluate", "finish") else "train"
            self.final_evaluation = final and kind == "evaluate"
            self.round = round
            self.exchange_deadline = None if timeout is None else time.time() + timeout
            self.open = dict.fromkeys(device_ids, kind)
            self.version += 1

    def exchange_done(self, kind: str, round: int, deliveries: Mapping[str, Delivery],
                      sizes: Mapping[str, int]) -> None:
        with self.lock:
            for device_id, delivery in deliveries.items():
                d = self._device(device_id)
                d["bytes_down"] += sizes.get(device_id, 0)
                d["rejected"] += len(delivery.rejected)  # invalid replies refused (issue 19)
                if delivery.rejected:
                    d["last_error"] = (f"round {round} {kind}: refused an invalid reply "
                                       f"({str(delivery.rejected[0])[:200]})")
                if delivery.reply is not None:
                    d["bytes_up"] += len(delivery.reply)
                    d["misses"] = 0
                    error = _reply_error(delivery.reply)
                    if error is not None:
                        d["last_error"] = f"round {round} {kind}: {error}"
                    if kind == "train":
                        d["last_round"] = round
                        d["rounds_completed"] += 1
                else:
                    d["misses"] += 1
                    d["last_error"] = f"round {round} {kind}: {delivery.error or 'no reply'}"
            self.open = {}
            self.exchange_deadline = None
            self.version += 1

    def round_recorded(self, record: Mapping[str, Any]) -> None:
        ev = record.get("eval") or {}
        entry = {
            "round": record.get("round"),
            "completed": len(record.get("completed", [])),
            "failed": sorted(record.get("failed", {})),
            "bytes_up": record.get("bytes_up_total", 0),
            "bytes_down": record.get("bytes_down_total", 0),
            "mean_accuracy": ev.get("mean_accuracy"),
            "tier_accuracy": ev.get("tier_accuracy", {}),
            # why traffic alternates (the dashboard says so): an evaluated round also sends the
            # evaluation's downlinks, after which the next training downlinks are not re-sent;
            # a CVAE round is one where the server trained its CVAE (Velo)
            "evaluated": bool(ev),
            "downlinks_not_resent": len(record.get("downlinks_not_resent", [])),
            "cvae": "cvae_loss" in (record.get("server") or {}),
        }
        privacy = record.get("privacy")
        with self.lock:
            self.history = (self.history + [_finite(entry)])[-HISTORY:]
            if privacy:  # differential privacy: ε spent so far per device (the server's ledger)
                for device_id, epsilon in privacy.get("epsilon", {}).items():
                    self._device(device_id)["epsilon"] = epsilon
                self.privacy = {k: privacy.get(k) for k in ("mode", "target_epsilon", "delta")}
            self.version += 1

    def finished(self, final: Mapping[str, Any] | None = None,
                 result: Mapping[str, Any] | None = None,
                 phase: str = "finished") -> None:
        """The run is over (``phase``: ``finished`` or ``interrupted``); ``final`` is the final
        evaluation (None when the run ended before it), ``result`` the run's result."""
        if phase not in TERMINAL:
            raise ValueError(f"phase {phase!r} is not a terminal phase ({', '.join(TERMINAL)})")
        with self.lock:
            self.phase, self.open, self.exchange_deadline, self.final_evaluation = (
                phase,
                {},
                None,
                False,
            )
            if final:
                self.history.append(_finite({"round": "final",
                                             "mean_accuracy": final.get("mean_accuracy"),
                                             "tier_accuracy": final.get("tier_accuracy", {})}))
            if result is not None:
                self.result = _finite(dict(result))
            self.version += 1

    # -- output ---------------------------------------------------------------------------------
    def state_of(self, device_id: str, d: Mapping[str, Any], now: float) -> str:
        kind = self.open.get(device_id)
        if self.connection(device_id) == "offline":
            since = self.offline_since.setdefault(device_id, now)
            # once the run is over nothing waits for it to come back: no grace
            over = self.phase in TERMINAL
            return "gone" if over or now - since >= self.gone_after else "late"
        self.offline_since.pop(device_id, None)
        if d["misses"] >= self.gone_after_misses:
            return "gone"
        replied = kind is not None and self.replied(device_id)
        if d["misses"] >= 1 and not replied:
            return "late"
        if kind is not None and not replied:
            if self.exchange_deadline is not None and now > self.exchange_deadline:
                return "late"
            return "training" if kind == "train" else "idle"
        return "idle"

    def snapshot(self) -> dict[str, Any]:
        now = time.time()
        with self.lock:
            devices = {}
            for device_id, d in sorted(self.devices.items()):
                seen = self.last_seen(device_id)
                devices[device_id] = {**d, "last_seen": seen,
                                      "state": self.state_of(device_id, d, now)}
            last_eval = next((h for h in reversed(self.history) if h.get("tier_accuracy")), None)
            return {
                "schema": 1,
                "fleet": self.fleet,
                "time": now,
                "server": {
                    "run": self.run_name, "algorithm": self.algorithm, "rounds": self.rounds,
                    "phase": self.phase,
                    "round": self.round, "deadline": self.exchange_deadline,
                    "round_timeout": self.deadline,
                    "started_at": self.started_at, "epoch": self.epoch,
                    "final_evaluation": self.final_evaluation,
                    "registered": self.registered_count, "expected": self.expected,
                    "result": self.result,
                    **({"privacy": dict(self.privacy)} if self.privacy else {}),
                },
                "devices": devices,
                "tier_accuracy": dict(last_eval["tier_accuracy"]) if last_eval else {},
                "history": list(self.history),
                # accuracies are the devices' claims (each on its own test data); bytes, states and
                # times are what the server saw itself
                "sources": {"device_reported": ["tier_accuracy", "history.mean_accuracy",
                                                "history.tier_accuracy"],
                            "server_measured": ["devices", "server", "history.bytes_up",
                                                "history.bytes_down", "history.completed",
                                                "history.failed"]},
            }


def result_of(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The run's result as the status shows it, from a run summary."""
    return _finite({
        "mean_accuracy": summary.get("mean_accuracy"),
        "devices": len(summary.get("client_accuracy") or {}),
        "measured_by": summary.get("measured_by", "final-evaluation"),
        "tier_accuracy": dict(summary.get("tier_accuracy") or {}),
        "from_last_round": dict(summary.get("accuracy_from_round") or {}),
        "rounds_completed": summary.get("rounds_completed", summary.get("rounds")),
    })


def display_round(kind: str, wire_round: int) -> int:
    """The round a human reads (from 1) for an exchange's wire round: a training request carries
    the method's round index (from 0); an evaluation or finish request the number of rounds
    completed before it (so the evaluation after round 1 is round 1)."""
    return wire_round + 1 if kind == "train" else wire_round


def _reply_error(data: bytes) -> str | None:
    """The reason of an error reply (a device that could not do what was asked), else None."""
    try:
        routing = peek(data)
    except Exception:  # noqa: BLE001 - an unreadable reply was refused already
        return None
    if routing.kind != "error":
        return None
    return str((routing.meta or {}).get("reason", "device error"))[:200]


def _finite(entry: dict[str, Any]) -> dict[str, Any]:
    """JSON has no NaN: an accuracy that could not be measured is null."""
    def clean(v):
        if isinstance(v, float) and v != v:
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v

    return {k: clean(v) for k, v in entry.items()}


class ObservedTransport:
    """The server's transport, with every exchange reported to a :class:`FleetStatus`."""

    def __init__(self, inner: Transport, status: FleetStatus):
        self.inner, self.status = inner, status

    def request(self, messages: Mapping[str, bytes], *, timeout: float | None,
                accept: Accept) -> dict[str, Delivery]:
        kind, rnd, final = "train", 0, False
        for data in messages.values():
            try:
                r = peek(data)
                kind, rnd, final = (
                    r.kind, display_round(r.kind, r.round), r.meta.get("split") == "test")
            except Exception:  # noqa: BLE001 - the transport reports what it cannot send
                pass
            break
        self.status.exchange_started(kind, rnd, sorted(messages), timeout, final=final)
        out = self.inner.request(messages, timeout=timeout, accept=accept)
        self.status.exchange_done(kind, rnd, out, {d: len(m) for d, m in messages.items()})
        return out

    def __getattr__(self, name: str) -> Any:  # requests that stay open (submit, arrivals, cancel)
        return getattr(self.inner, name)

    def close(self) -> None:
        self.inner.close()


class StatusPublisher:
    """A thread that looks at the snapshot every ``interval`` seconds and publishes it when it
    changed, or every ``heartbeat`` seconds regardless (and at once on stop): an idle fleet costs
    the broker one message per heartbeat, not one per second."""

    def __init__(self, status: FleetStatus, publish: Callable[[bytes], None] | None,
                 run_dir: Path | None = None,
                 interval: float = 1.0, heartbeat: float = 10.0):
        self.status, self.publish, self.run_dir, self.interval, self.heartbeat = (
            status, publish, run_dir, interval, heartbeat)
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.last: tuple[str, float] | None = None  # (content without its time, when published)

    def start(self) -> StatusPublisher:
        self.thread = threading.Thread(target=self._run, name="edgefl-status", daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stopping.wait(self.interval):
            self.publish_now(force=False)

    def publish_now(self, force: bool = True) -> None:
        try:
            snapshot = self.status.snapshot()
            content = json.dumps({k: v for k, v in snapshot.items() if k != "time"}, sort_keys=True)
            now = time.monotonic()
            if (
                not force
                and self.last is not None
                and self.last[0] == content
                and now - self.last[1] < self.heartbeat
            ):
                return
            self.last = (content, now)
            data = json.dumps(snapshot, sort_keys=True).encode()
            if self.publish is not None:
                self.publish(data)
            if self.run_dir is not None:
                self.run_dir.mkdir(parents=True, exist_ok=True)
                tmp = self.run_dir / "status.json.tmp"
                tmp.write_bytes(data)
                tmp.replace(self.run_dir / "status.json")
        except Exception:  # noqa: BLE001 - status is best effort; the run goes on
            log.exception("could not publish the fleet status")

    def stop(self) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(5)
        self.publish_now()
