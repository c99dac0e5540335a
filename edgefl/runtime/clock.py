"""A fleet as it is, on a simulated wall clock: who is online when, how long each device takes.

A fleet file's ``clock`` section and device entries (:class:`~edgefl.profiling.fleet.Conditions`)
declare each device's availability (always on; churn: on and off spells with given means;
diurnal), its link (bandwidth each way, latency) and its compute speed (its profile's
``train_gflops`` × ``speed``). ``edgefl simulate --fleet-file F`` then keeps a simulated clock
beside the rounds (``simulated_seconds`` in every round record and in the summary):

- a device's local work takes  latency + bytes down / down bandwidth  (the model it is sent)
  + its training cost / its speed  (the samples it trains × the model's training FLOPs per
  sample, :func:`~edgefl.profiling.measurement.estimate_round_seconds`: modelled, not timed on
  this machine, so the clock is the same under any load)  + latency + bytes up / up bandwidth;
  the bytes down are those the round's exchange counted; the bytes up are the update's arrays
  plus :data:`UPDATE_META_BYTES` (:func:`update_bytes`: the counted size would carry the
  digits of the device's measured training time into the clock);
- a synchronous round starts when a device can be selected: devices offline then are not
  selected (if none is online the clock waits for the first to come back); it ends when every
  selected device has finished or gone offline, or at the clock's deadline (``deadline_s``):
  a device that goes offline before it finishes, or finishes after the deadline, is failed that
  round and its update is not aggregated (it trained all the same);
- asynchronous buffered aggregation (:mod:`edgefl.runtime.buffered`) runs its events on this
  clock: an update arrives when its device's local work is done, a device offline when it would
  pull the model pulls it when it is back, and an update whose device goes offline in flight
  is lost (the device pulls the newest model when it is back). Staleness follows from the order.

Evaluation is a measurement, not fleet work: it takes no simulated time and asks every device,
online or not. Everything is drawn from the run seed and the device id, so a run's clock is
reproducible.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from edgefl.errors import ConfigError
from edgefl.profiling.fleet import Availability, Conditions
from edgefl.runtime.derived import derive_seed

#: What an update's envelope header and metadata cost on the simulated link, beyond its arrays
#: (a FedAvg update of the test fleet: 45,960 bytes counted, of which about 1 KiB not arrays).
UPDATE_META_BYTES = 1024


def update_bytes(reply: Any) -> int:
    """An update's size on the simulated link: its arrays and :data:`UPDATE_META_BYTES`. Not the
    counted size: the device's metadata holds its measured training time, whose digits (0.09 s
    or 0.11 s) would make two runs of one seed end at different simulated times."""
    arrays = reply.payload.arrays.values()
    return sum(np.asarray(a).nbytes for a in arrays) + UPDATE_META_BYTES

if TYPE_CHECKING:
    from edgefl.algorithms.base import ServerContext
    from edgefl.profiling import Fleet

INF = math.inf
# the round loop's Exchange (edgefl.runtime.loop imports this module)
Exchange = Any


class Timeline:
    """One device's availability: ``online(t)``, when its online spell ends, when it is back."""

    def __init__(self, availability: Availability, seed: int):
        self.a = availability
        self.rng = np.random.default_rng(seed)
        self.phase = 0.0
        if availability.kind == "diurnal":
            drawn = self.rng.uniform(0.0, availability.period_s)
            self.phase = availability.phase_s if availability.phase_s is not None else drawn
        # churn: online spells [start, end), in order, drawn as far as asked
        self._starts: list[float] = []
        self._ends: list[float] = []
        self._drawn = 0.0  # spells are drawn up to here
        self._on = False
        if availability.kind == "churn":
            self._on = bool(self.rng.random() >= availability.offline_fraction)

    def _draw_until(self, t: float) -> None:
        a = self.a
        while self._drawn <= t:
            mean = a.mean_on_s if self._on else a.mean_off_s
            end = self._drawn + float(self.rng.exponential(mean))
            if self._on:
                self._starts.append(self._drawn)
                self._ends.append(end)
            self._drawn, self._on = end, not self._on

    def _spell(self, t: float) -> int:
        """Index of the first online spell ending after ``t``."""
        self._draw_until(t)
        while True:
            i = bisect.bisect_right(self._ends, t)
            if i < len(self._ends):
                return i
            self._draw_until(self._drawn)  # t is in the offline spell drawn last: one more spell

    def online(self, t: float) -> bool:
        if self.a.kind == "always":
            return True
        if self.a.kind == "diurnal":
            return (t + self.phase) % self.a.period_s < self.a.on_fraction * self.a.period_s
        i = self._spell(t)
        return self._starts[i] <= t

    def online_until(self, t: float) -> float:
        """When the online spell holding ``t`` ends (``t`` itself when offline at ``t``)."""
        if not self.online(t):
            return t
        if self.a.kind == "always" or self.a.on_fraction == 1.0 and self.a.kind == "diurnal":
            return INF
        if self.a.kind == "diurnal":
            into = (t + self.phase) % self.a.period_s
            return t + self.a.on_fraction * self.a.period_s - into
        return self._ends[self._spell(t)]

    def next_online(self, t: float) -> float:
        """``t`` when online then, else when the device comes back."""
        if self.online(t):
            return t
        if self.a.kind == "diurnal":
            into = (t + self.phase) % self.a.period_s
            return t + self.a.period_s - into
        return self._starts[self._spell(t)]

    def longest_spell(self) -> float:
        """The longest online spell the device can have (INF: unbounded)."""
        return (
            self.a.on_fraction * self.a.period_s
            if self.a.kind == "diurnal" and self.a.on_fraction < 1
            else INF
        )


class FleetClock:
    """The simulated clock of a run on a fleet with :class:`Conditions` per device.

    ``compute`` holds each device's modelled local-work seconds per round (the samples it trains
    on its model / its speed); the round loop (:meth:`select`, :meth:`settle`) and buffered
    aggregation (:meth:`flight`, :meth:`next_online`) move the clock."""

    def __init__(
        self,
        conditions: Mapping[str, Conditions],
        compute: Mapping[str, float],
        seed: int,
        deadline: float | None = None,
    ):
        missing = sorted(set(compute) - set(conditions))
        if missing:
            raise ConfigError(f"the fleet clock has no conditions for {', '.join(missing)}")
        self.conditions = dict(conditions)
        self.compute = dict(compute)
        self.deadline = deadline
        self.timelines = {
            d: Timeline(c.availability, derive_seed(seed, f"availability/{d}"))
            for d, c in self.conditions.items()
        }
        self.now = 0.0

    @classmethod
    def for_fleet(cls, fleet: Fleet, ctx: ServerContext, seed: int) -> FleetClock:
        """The clock of ``fleet`` (a fleet file) for the run ``ctx`` holds: each device's training
        cost from its model and its samples per round, on its profile × its speed."""
        from edgefl.profiling.measurement import estimate_round_seconds

        profiles = dict(fleet.devices)
        compute = {}
        for d, record in ctx.fleet.items():
            profile, cond = profiles[d], fleet.conditions[d]
            if profile.train_gflops <= 0:
                raise ConfigError(
                    f"the fleet clock needs {d}'s train_gflops "
                    f"(its profile {profile.name!r} has none)"
                )
            visits = ctx.settings.visits(max(record.num_samples, 1))
            compute[d] = estimate_round_seconds(record.spec, profile, visits) / cond.speed
        return cls(fleet.conditions, compute, seed, fleet.clock.deadline_s)

    # -- one device's work -----------------------------------------------------------------
    def transfer(self, device: str, nbytes: int, up: bool) -> float:
        """Seconds one message of ``nbytes`` takes on ``device``'s link (latency included)."""
        link = self.conditions[device].link
        mbps = link.up_mbps if up else link.down_mbps
        return link.latency_ms / 1e3 + (8.0 * nbytes / (mbps * 1e6) if mbps else 0.0)

    def duration(self, device: str, bytes_down: int, bytes_up: int) -> float:
        """Seconds from sending ``device`` the model to its update's arrival."""
        return (
            self.transfer(device, bytes_down, False)
            + self.compute[device]
            + self.transfer(device, bytes_up, True)
        )

    def online(self, device: str, t: float | None = None) -> bool:
        return self.timelines[device].online(self.now if t is None else t)

    def next_online(self, device: str, t: float) -> float:
        return self.timelines[device].next_online(t)

    def flight(
        self, device: str, start: float, bytes_down: int, bytes_up: int
    ) -> tuple[float, bool]:
        """(when, arrived): the update of work started at ``start`` arrives then (True), or the
        device goes offline then, before it is done (False)."""
        end = start + self.duration(device, bytes_down, bytes_up)
        leaves = self.timelines[device].online_until(start)
        if leaves < end and self.timelines[device].longest_spell() < end - start:
            raise ConfigError(
                f"{device}'s local work ({end - start:.0f} s on the simulated clock) is longer "
                "than any online spell its availability allows: it could never deliver an update"
            )
        return (end, True) if end <= leaves else (leaves, False)

    # -- a synchronous round ---------------------------------------------------------------
    def select(self, candidates: list[str]) -> tuple[list[str], dict[str, Any]]:
        """The ``candidates`` online at the round's start (the clock waits until one is)."""
        if candidates and not any(self.online(d) for d in candidates):
            self.now = min(self.next_online(d, self.now) for d in candidates)
        online = [d for d in candidates if self.online(d)]
        return online, {"start": self.now, "offline": sorted(set(candidates) - set(online))}

    def settle(self, ex: Exchange, record: dict[str, Any], drop: bool = True) -> dict[str, Any]:
        """The round's clock from its exchange: each device's simulated seconds; devices that went
        offline before they finished or finished after the deadline are moved from the replies to
        the failures (``drop``); the clock moves to the round's end. Returns ``record``
        completed."""
        start, seconds, dropped, ends = self.now, {}, {}, []
        for d in sorted(ex.replies):
            down, up = ex.bytes_down.get(d, 0), update_bytes(ex.replies[d])
            seconds[d] = self.duration(d, down, up)
            end, arrived = self.flight(d, start, down, up)
            if not arrived:
                dropped[d] = f"went offline at {end - start:.1f} s of the round (simulated clock)"
            elif self.deadline is not None and end - start > self.deadline:
                dropped[d] = (
                    f"missed the {self.deadline:g} s deadline "
                    f"(simulated clock: {end - start:.1f} s)"
                )
            if self.deadline is not None:
                end = min(end, start + self.deadline)
            ends.append(end)
        if drop:
            for d, reason in dropped.items():
                del ex.replies[d]
                ex.bytes_up.pop(d, None)
                ex.failed[d] = reason
        self.now = max(ends, default=start)
        record.update(seconds=seconds, dropped=dropped, end=self.now)
        return record


def fleet_clock(fleet: Fleet | None, ctx: ServerContext, seed: int) -> FleetClock | None:
    """The run's clock when its fleet came from a fleet file (None without one)."""
    return (
        FleetClock.for_fleet(fleet, ctx, seed) if fleet is not None and fleet.conditions else None
    )
