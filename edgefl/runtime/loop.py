"""The round loop: the one place where a federated run is orchestrated.

    for each round: select devices → send downlinks → collect uplinks until all arrived or the
    deadline → aggregate what arrived → evaluate (every ``eval_every`` rounds) → record → checkpoint
    then: send every device its final downlink (``finish``; with ``collect_models`` the device
    answers with its final model) → evaluate on the test split under the final deadline.

Rounds are numbered from 1 wherever a person reads them (records, logs, status, plots); the
methods and the wire keep the round index from 0 (a training request for round 1 carries index
0), and an evaluation request carries the number of rounds completed before it.

The final result never lacks a number it could have: a device that misses the final evaluation
(or is offline then) is counted with its last per-round evaluation, marked as such
(``accuracy_from_round``, ``measured_by``). Devices whose Last Will said offline are neither
selected nor asked (``available``) until they register again. Ctrl-C (KeyboardInterrupt) between
or during rounds ends the run with the rounds completed (``final["interrupted"]``; with
``finish_on_interrupt`` the devices still get the finish exchange, and send their models).

It knows nothing of MQTT or of any particular method: it talks to a :class:`Transport` in
envelopes (a wire transport encodes them: :class:`~edgefl.transport.base.Encoded`) and to a
:class:`ServerHalf` in payloads. Failed and late devices are recorded, not raised.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from statistics import mean
from typing import TYPE_CHECKING, Any

import numpy as np

from edgefl.algorithms.base import ServerContext, ServerHalf, total_rounds
from edgefl.errors import AllDevicesFailed
from edgefl.runtime import checkpoint
from edgefl.runtime.buffered import BufferedRounds
from edgefl.runtime.claims import bound_uplinks
from edgefl.runtime.exchange import (
    MAX_SAMPLES,
    MODEL_PREFIX,
    SEND_MODEL,
    UNCHANGED,
    Exchange,
    LoopSettings,
)
from edgefl.runtime.interrupt import second_interrupt_exits
from edgefl.runtime.live import LiveRounds
from edgefl.transport.base import Transport
from edgefl.wire import Envelope, Payload, new_nonce
from edgefl.wire.schema import ArraySpec, Expectation
from edgefl.wire.validate import check_reply

if TYPE_CHECKING:
    from edgefl.runtime.clock import FleetClock

log = logging.getLogger(__name__)
#: Uplink metadata the round record keeps under its own keys, not in ``device_metrics``.
_RECORDED_APART = frozenset({"train_loss", "train_seconds", "num_samples"})


class RoundLoop:
    def __init__(
        self,
        server: ServerHalf,
        ctx: ServerContext,
        transport: Transport,
        settings: LoopSettings,
        *,
        on_round: Callable[[dict[str, Any]], None] | None = None,
        before_round: Callable[[int], None] | None = None,
        on_progress: Callable[..., None] | None = None,
        available: Callable[[str], bool] | None = None,
        collect_models: Callable[[str], Mapping[str, ArraySpec]] | None = None,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
        clock: FleetClock | None = None,
    ):
        self.server, self.ctx, self.transport, self.settings = server, ctx, transport, settings
        self.on_round = on_round or (lambda record: None)
        # whether a device may be asked (a real fleet: not while its Last Will says offline)
        self.available = available or (lambda device_id: True)
        # device → the arrays its final model must have: the finish exchange asks for it
        self.collect_models = collect_models
        # "final_evaluation" (before it: devices, deadline, samples) and "final_evaluation_done"
        self.on_event = on_event or (lambda name, info: None)
        # device → its final model's arrays
        self.final_models: dict[str, dict[str, np.ndarray]] = {}
        # device → (round, accuracy) of its last evaluation
        self.last_eval: dict[str, tuple[int, float]] = {}
        self.rounds_completed = 0
        self._skipped: frozenset[str] = frozenset()
        # called before each round and before the closing exchanges: a deployment's server
        # adds devices that registered meanwhile to ctx.fleet here (never during an exchange)
        self.before_round = before_round or (lambda round: None)
        # on_progress(stage, round, done, total): an exchange has replies from ``done`` of its
        # ``total`` devices (stage: train, evaluate, finish or final; round: the training round,
        # counted from 1, or None for the closing exchanges). Called on the transport's threads.
        self.on_progress = on_progress or (lambda *a, **kw: None)
        # the settings' training rounds (they may be fewer than the context's) + the closing rounds
        self.total_rounds = total_rounds(settings.rounds, ctx.closing_rounds)
        self.start_round = self._resume()
        # device → the round whose evaluation downlink it absorbed last, with no local work since:
        # its train downlink for that round would repeat it byte for byte (a downlink is a function
        # of the server state and the round, and evaluation changes neither), so it is not re-sent
        self._holds_downlink: dict[str, int] = {}
        # the simulated wall clock of a fleet with declared conditions (runtime/clock.py)
        self.clock = clock
        # asynchronous: simulated time in memory, real time where requests stay open (MQTT)
        if settings.buffer and getattr(transport, "asynchronous", False):
            self.buffered: BufferedRounds | LiveRounds | None = LiveRounds(settings.buffer)
        else:
            self.buffered = BufferedRounds(settings.buffer, clock) if settings.buffer else None

    @property
    def simulated_seconds(self) -> float | None:
        """The simulated clock (None without a fleet clock)."""
        if self.clock is None:
            return None
        return self.buffered.clock if isinstance(self.buffered, BufferedRounds) else self.clock.now

    # -- one exchange ---------------------------------------------------------------------------
    def exchange(self, kind: str, round: int, payloads: Mapping[str, Payload], expect: str,
                 stage: str | None = None,
                 timeout: float | None = None) -> Exchange:
        out = Exchange()
        messages, wants = {}, {}
        for device_id, payload in payloads.items():
            record = self.ctx.fleet[device_id]
            env = Envelope(
                kind=kind,
                round=round,
                device_id=device_id,
                fleet=self.settings.fleet,
                algorithm=self.settings.algorithm,
                tier=record.spec.tier,
                payload=payload,
                run=self.settings.run_id,
                nonce=new_nonce(),
            )
            arrays = None
            if expect == "update":
                arrays = self.server.expected_uplink(device_id)
            elif (
                expect == "done"
                and payload.meta.get(SEND_MODEL)
                and self.collect_models is not None
            ):
                arrays = self.collect_models(device_id)
            wants[device_id] = Expectation(
                kind, round, device_id, env.fleet, env.tier, env.run, env.nonce, env.algorithm,
                arrays=arrays, max_samples=record.num_samples or None,
            )
            messages[device_id] = env

        def accept(device_id: str, reply: Envelope) -> Envelope:
            """Check a (decoded) reply; a WireError refuses it (the transport keeps waiting)."""
            check_reply(reply, wants[device_id])
            answered.add(device_id)
            self.on_progress(stage, shown, len(answered), len(messages))
            return reply

        stage = stage or kind
        shown = None if stage in ("finish", "final") else self.ctx.round + 1
        answered: set[str] = set()
        self.on_progress(stage, shown, 0, len(messages))
        deliveries = self.transport.request(
            messages, timeout=self.settings.timeout if timeout is None else timeout, accept=accept
        )
        for device_id in payloads:
            d = deliveries.get(device_id)
            out.bytes_down[device_id] = d.bytes_down if d is not None else 0
            if d is not None and d.rejected:
                out.rejected[device_id] = len(d.rejected)
                log.warning("round %d: refused %d invalid replies from %s (first: %s)", round,
                            len(d.rejected), device_id, d.rejected[0])
            if d is None or d.reply is None:
                out.failed[device_id] = d.error if d is not None else "no reply"
                continue
            out.bytes_up[device_id] = d.bytes_up
            out.seconds[device_id] = d.seconds
            reply = d.value
            if reply.kind == "error":
                out.failed[device_id] = str(reply.payload.meta.get("reason", "device error"))
            else:
                out.replies[device_id] = reply
        counted = round + 1 if kind == "train" else round  # from 1, as the records count
        for device_id, reason in out.failed.items():
            log.warning("round %d: device %s failed its %s: %s", counted, device_id, kind, reason)
        return out

    def reachable(self, device_ids: list[str], round: int) -> list[str]:
        """The devices that may be asked now; says once when devices drop out or come back."""
        ok = [d for d in device_ids if self.available(d)]
        skipped = frozenset(device_ids) - frozenset(ok)
        if skipped != self._skipped:
            if skipped - self._skipped:
                log.warning(
                    "round %d: not asking %s (offline: its Last Will; asked again once it "
                    "registers)",
                    round,
                    ", ".join(sorted(skipped - self._skipped)),
                )
            if self._skipped - skipped:
                log.info("round %d: %s is back", round, ", ".join(sorted(self._skipped - skipped)))
            self._skipped = skipped
        return ok

    # -- evaluation -----------------------------------------------------------------------------
    def evaluate(self, round: int, split: str, with_downlink: bool, stage: str = "evaluate", *,
                 timeout: float | None = None,
                 max_samples: int | None = None) -> dict[str, Any]:
        """Evaluate the reachable devices after ``round`` rounds. A device that does not answer
        is in ``eval_failed``; ``mean_accuracy`` is None when none answered (never NaN)."""
        payloads = {}
        asked = self.reachable(sorted(self.ctx.fleet), round)
        busy = self.buffered.busy() if isinstance(self.buffered, LiveRounds) else set()
        asked = [d for d in asked if d not in busy]  # async over MQTT: those not training now
        for device_id in asked:
            p = self.server.downlink(round, device_id) if with_downlink else Payload()
            meta = {**p.meta, "split": split}
            if max_samples is not None:
                meta[MAX_SAMPLES] = int(max_samples)
            payloads[device_id] = Payload(p.arrays, meta)
        ex = self.exchange("evaluate", round, payloads, expect="metrics", stage=stage,
                           timeout=timeout)
        if with_downlink:
            self._holds_downlink.update(dict.fromkeys(ex.replies, round))
        acc = {d: float(r.payload.meta["accuracy"]) for d, r in ex.replies.items()}
        failed = dict(ex.failed)
        for d in sorted(set(self.ctx.fleet) - set(asked) - busy):
            failed[d] = "not asked: offline (its Last Will)"
        return {
            "split": split,
            "mean_accuracy": mean(acc.values()) if acc else None,
            "tier_accuracy": self._by_tier(acc),
            "client_accuracy": acc,
            "eval_failed": failed,
            **({"not_asked_training": sorted(busy)} if busy else {}),
            "bytes_down": ex.bytes_down,
            "bytes_up": ex.bytes_up,
        }

    def _by_tier(self, acc: Mapping[str, float]) -> dict[str, float]:
        by_tier: dict[str, list[float]] = {}
        for d, a in acc.items():
            by_tier.setdefault(self.ctx.fleet[d].spec.tier, []).append(a)
        return {t: mean(v) for t, v in by_tier.items()}

    def standing_result(self, measured: Mapping[str, float]) -> dict[str, Any]:
        """The run's result: ``measured`` (device → accuracy at the end) and, for every other
        device of the fleet, its last per-round evaluation, marked in ``accuracy_from_round``."""
        acc = dict(measured)
        from_round = {}
        for d in sorted(self.ctx.fleet):
            if d not in acc and d in self.last_eval:
                from_round[d], acc[d] = self.last_eval[d]
        measured_by = (
            "final-evaluation" if not from_round else ("last-round" if not measured else "mixed")
        )
        return {
            "mean_accuracy": mean(acc.values()) if acc else None,
            "tier_accuracy": self._by_tier(acc),
            "client_accuracy": acc,
            "accuracy_from_round": from_round,
            "measured_by": measured_by if acc else "none",
            "unmeasured": sorted(set(self.ctx.fleet) - set(acc)),
        }

    # -- the loop -------------------------------------------------------------------------------
    def run_round(self, round: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        self.ctx.round = round
        if self.buffered is not None:  # asynchronous: this round is the next `buffer` arrivals
            ex, payloads, timing = Exchange(), {}, None
            selected, fresh, buffered = self.buffered.collect(self, round, ex)
        else:
            candidates, timing = self.reachable(sorted(self.ctx.fleet), round + 1), None
            if self.clock is not None:  # devices offline on the simulated clock are not selected
                candidates, timing = self.clock.select(candidates)
            selected = self.server.select(round, candidates, self.ctx.rng(round))
            payloads = {}
            if self.server.secagg is None:
                payloads = {
                    d: Payload({}, {UNCHANGED: round})
                    if self._holds_downlink.get(d) == round
                    else self.server.downlink(round, d)
                    for d in selected
                }
            for d in selected:
                # it trains now: its model is no longer the downlink's
                self._holds_downlink.pop(d, None)
            if payloads or not selected:
                ex = self.exchange("train", round, payloads, expect="update")
                if timing is not None:  # who finished in time on the simulated clock
                    self.clock.settle(ex, timing)
                fresh = {d: r.payload for d, r in ex.replies.items()}
            else:  # secure aggregation: four exchanges, one sum (runtime/secure.py)
                from edgefl.runtime.secure import secure_round

                ex, fresh = secure_round(self, round, selected, Exchange())
                if timing is not None:
                    self.clock.settle(ex, timing, drop=False)
            buffered = None
        dropped = bool(timing and timing["dropped"])  # the simulated clock's, not failures
        if selected and not ex.replies and self.settings.stop_when_all_fail and not dropped:
            failed = {d: ex.failed.get(d, "no reply") for d in selected}
            raise AllDevicesFailed(round, failed, self.server.all_failed_hint(failed))
        t1 = time.perf_counter()
        uplinks, clipped = bound_uplinks(
            round, fresh, self.ctx.fleet, self.settings.weight_ratio, self.server.count_arrays,
            self.ctx.settings.visits
        )
        server_metrics = self.server.aggregate(round, uplinks)
        t2 = time.perf_counter()
        metas = {d: r.payload.meta for d, r in ex.replies.items()}
        record: dict[str, Any] = {
            "round": round + 1,  # from 1, as people count (the methods' index is round)
            "phase": "train" if round < self.settings.rounds else "closing",
            "selected": selected,
            "completed": sorted(ex.replies),
            "failed": ex.failed,
            "rejected": ex.rejected,
            # device-supplied weights above the bound: {device: {field: [claimed, used]}}
            "clipped": clipped,
            "bytes_down": ex.bytes_down,
            "bytes_up": ex.bytes_up,
            "bytes_down_total": sum(ex.bytes_down.values()),
            "bytes_up_total": sum(ex.bytes_up.values()),
            "downlinks_not_resent": sorted(d for d, p in payloads.items() if UNCHANGED in p.meta),
            "train_loss": {d: m["train_loss"] for d, m in metas.items() if "train_loss" in m},
            "train_seconds": {d: m["train_seconds"] for d, m in metas.items()
                              if "train_seconds" in m},
            # everything else a device reported about its local work (e.g. FedVTC's ce, l_e, l_dm)
            "device_metrics": {
                d: {k: float(v) for k, v in m.items()
                    if k not in _RECORDED_APART and isinstance(v, (int, float))
                    and not isinstance(v, bool)}
                for d, m in metas.items()
            },
            # sent → reply, local work included
            "reply_seconds": {d: ex.seconds[d] for d in ex.replies},
            "collect_seconds": t1 - t0,
            "aggregate_seconds": t2 - t1,
            "server": server_metrics,
            **self.server.round_report(),  # e.g. the privacy ledger: ε per device so far
        }
        if buffered is not None:
            # simulated clock, staleness per update, updates in flight
            record["buffered"] = buffered
        elif timing is not None:
            record["clock"] = timing  # start, end, each device's seconds, who dropped and why
        if self.clock is not None:
            record["simulated_seconds"] = self.simulated_seconds
        # Training rounds are evaluated every eval_every rounds on the per-round split, the last
        # one too: a run's curve is on one evaluation set from its first point to its last (the
        # final evaluation, after the finish exchange, is on the test split, often larger; closing
        # a curve with it moved the last-quarter slope by up to the two sets' difference).
        # Closing rounds train nothing: never evaluated.
        training = round < self.settings.rounds
        if (
            training
            and self.settings.eval_every > 0
            and (round + 1) % self.settings.eval_every == 0
        ):
            record["eval"] = self.evaluate(round + 1, self.settings.eval_split, with_downlink=True)
            for d, a in record["eval"]["client_accuracy"].items():
                self.last_eval[d] = (round + 1, a)
            # the evaluation's downlinks and replies are traffic of this round too
            for key in ("bytes_down", "bytes_up"):
                extra = record["eval"].pop(key)
                record[f"eval_{key}"] = extra
                record[f"{key}_total"] += sum(extra.values())
        record["round_seconds"] = time.perf_counter() - t0
        return record

    def run(self) -> dict[str, Any]:
        """All rounds, the finish exchange and the final evaluation; returns the final result.
        On Ctrl-C: the result of the rounds completed, with ``interrupted`` true (a second
        Ctrl-C while it is put together exits at once)."""
        t0 = time.perf_counter()
        self.rounds_completed = self.start_round
        self._finished = False
        try:
            return self._run(t0)
        except KeyboardInterrupt:
            with second_interrupt_exits():
                return self._interrupted(t0)

    def _run(self, t0: float) -> dict[str, Any]:
        for round in range(self.start_round, self.total_rounds):
            self.before_round(round)
            record = self.run_round(round)
            self._checkpoint(round)
            self.rounds_completed = round + 1
            self.on_round(record)
        end = self.total_rounds
        if isinstance(self.buffered, LiveRounds):
            self.buffered.close(self)  # updates in flight are not used
        self.before_round(end)
        self.ctx.round = end
        finished = self._finish(end, self.settings.timeout)
        self._finished = True
        final_timeout = (
            self.settings.final_timeout
            if self.settings.final_timeout is not None
            else self.settings.timeout
        )
        asked = self.reachable(sorted(self.ctx.fleet), end)
        self.on_event("final_evaluation",
                      {"devices": len(asked), "deadline": final_timeout,
                       "samples": self.settings.final_samples})
        t1 = time.perf_counter()
        measured = self.evaluate(end, "test", with_downlink=False, stage="final",
                                 timeout=final_timeout,
                                 max_samples=self.settings.final_samples)
        final = self.standing_result(measured["client_accuracy"])
        final.update(split="test", eval_failed=measured["eval_failed"],
                     final_answered=len(measured["client_accuracy"]),
                     final_evaluation_seconds=time.perf_counter() - t1)
        self.on_event("final_evaluation_done",
                      {"answered": len(measured["client_accuracy"]), "devices": len(asked),
                       "failed": sorted(measured["eval_failed"])})
        final["finish_failed"] = finished.failed
        final["finish_bytes_down"] = sum(finished.bytes_down.values())
        # training rounds (closing ones apart)
        final["rounds_completed"] = min(self.rounds_completed, self.settings.rounds)
        final["interrupted"] = False
        final["wall_seconds"] = time.perf_counter() - t0
        return final

    def _finish(self, end: int, timeout: float | None) -> Exchange:
        """The finish exchange with the reachable devices (with ``collect_models``: each answers
        with its final model, checked against the arrays its model must have)."""
        payloads = {}
        for d in self.reachable(sorted(self.ctx.fleet), end):
            p = self.server.downlink(end, d)
            payloads[d] = (
                Payload(p.arrays, {**p.meta, SEND_MODEL: True})
                if self.collect_models is not None
                else p
            )
        finished = self.exchange("finish", end, payloads, expect="done", timeout=timeout)
        for d, reply in finished.replies.items():
            if reply.payload.arrays:
                self.final_models[d] = {
                    k[len(MODEL_PREFIX) :]: v for k, v in reply.payload.arrays.items()
                }
        return finished

    def _interrupted(self, t0: float) -> dict[str, Any]:
        done = self.rounds_completed
        log.warning(
            "interrupted after %d of %d rounds; writing what they produced (Ctrl-C again exits "
            "at once)", done, self.total_rounds)
        final = self.standing_result({})
        final.update(split=None, eval_failed={}, final_answered=0, finish_failed={},
                     finish_bytes_down=0)
        if self.settings.finish_on_interrupt and done > 0 and not self._finished:
            # the run ends with the rounds completed: devices take the final downlink (and send
            # their models)
            self.ctx.round = done
            if isinstance(self.buffered, LiveRounds):
                self.buffered.close(self)
            finished = self._finish(done, self.settings.interrupt_timeout)
            final.update(finish_failed=finished.failed,
                         finish_bytes_down=sum(finished.bytes_down.values()))
        final.update(rounds_completed=min(done, self.settings.rounds), interrupted=True,
                     wall_seconds=time.perf_counter() - t0)
        return final

    # -- checkpoints (runtime/checkpoint.py) -----------------------------------------------------
    def _checkpoint(self, round: int) -> None:
        if self.settings.checkpoint_dir is not None:
            checkpoint.save(self.settings.checkpoint_dir, self.server.state_dict(), round + 1)

    def _resume(self) -> int:
        """Rounds already completed by an earlier server (its checkpoint); 0 without one."""
        found = checkpoint.load(self.settings.checkpoint_dir)
        if found is None:
            return 0
        done, state = found
        self.server.load_state_dict(state)
        log.info("resuming after round %d from %s", done, self.settings.checkpoint_dir)
        return done
