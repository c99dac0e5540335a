"""One run's lifecycle, the same in memory (``edgefl simulate``) and over MQTT (``edgefl server``):

    life = RunLifecycle(cfg, method, run_dir, on_round=on_round)
    loop = life.loop(server, ctx, transport, settings, on_progress=...)
    summary = life.run(Ending(save_models=...))

config.json (before the first round and again at the end: devices that joined mid-run are in the
fleet too), rounds.jsonl (one record per round, in order, as the round loop completes them),
then the summary (JSON and markdown), the plots and the final models. Ctrl-C ends the rounds with
those completed (:meth:`RoundLoop.run <edgefl.runtime.loop.RoundLoop.run>`); the record is still
written whole, marked interrupted (a second Ctrl-C while it is written exits at once), and
:class:`~edgefl.errors.RunInterrupted` raised with the summary.

What differs between transports is given to it: the config fields that only one of them knows
(:attr:`Ending.config`), what a round record gains before it is written (:attr:`Ending.annotate`:
the MQTT transport's byte counts), how the final models are saved and what the summary says
of them (:attr:`Ending.save_models`), and what happens once the record is written
(:attr:`Ending.ended`: the fleet status's last word).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgefl.errors import RunInterrupted
from edgefl.report import RunRecorder
from edgefl.report.recorder import finish_run, result_text, run_summary
from edgefl.runtime.claims import label_summary
from edgefl.runtime.exchange import LoopSettings
from edgefl.runtime.interrupt import second_interrupt_exits
from edgefl.runtime.loop import RoundLoop

if TYPE_CHECKING:
    from edgefl.algorithms import ServerContext, ServerHalf
    from edgefl.config import RunConfig
    from edgefl.runtime.method import Method
    from edgefl.transport.base import Transport

Record = dict[str, Any]


def _nothing(*_: Any) -> None:
    return None


@dataclass
class Ending:
    """A transport's part of the lifecycle (every field optional)."""

    #: config.json fields beyond the run configuration, the method's options and the fleet
    config: Callable[[], dict[str, Any]] = dict
    #: called with each round record before it is written (may add to it)
    annotate: Callable[[Record], None] = _nothing
    #: called with the loop's result once the rounds are over: saves the final models and
    #: returns what the summary says beyond the common fields
    save_models: Callable[[dict[str, Any]], dict[str, Any]] = lambda final: {}
    #: called with the loop's result and the summary once the record is written
    ended: Callable[[dict[str, Any], dict[str, Any]], None] = _nothing


class RunLifecycle:
    """Recorder, config, round records, the one round loop, summary, finish marking and plots.

    ``keep_rounds``: a resumed run (the server restarted from its checkpoint) keeps the round
    records already in ``run_dir``'s rounds.jsonl and appends to them."""

    def __init__(
        self,
        cfg: RunConfig,
        method: Method,
        run_dir: Path,
        *,
        on_round: Callable[[Record], None] | None = None,
        plots: bool = True,
        keep_rounds: bool = False,
        started: float | None = None,
    ):
        self.cfg, self.method, self.run_dir = cfg, method, Path(run_dir)
        self.on_round = on_round or _nothing
        self.plots = plots
        self.started = time.perf_counter() if started is None else started
        previous = self.run_dir / "rounds.jsonl"
        kept = previous.read_text() if keep_rounds and previous.exists() else ""
        self.recorder = RunRecorder(self.run_dir)
        if kept:
            self.recorder.rounds_path.write_text(kept)
        self.rounds: list[Record] = []  # the round records this process saw
        self.ending = Ending()
        self._loop: RoundLoop | None = None

    def loop(self, server: ServerHalf, ctx: ServerContext, transport: Transport,
             settings: LoopSettings,
             **hooks: Any) -> RoundLoop:
        """The run's round loop (``hooks``: RoundLoop's keyword arguments but ``on_round``)."""
        self._loop = RoundLoop(server, ctx, transport, settings, on_round=self._record, **hooks)
        return self._loop

    def _record(self, r: Record) -> None:
        self.ending.annotate(r)
        self.rounds.append(r)
        self.recorder.append_round(r)
        self.on_round(r)

    def write_config(self) -> None:
        """config.json: the run configuration, the method's resolved options, the fleet as the
        loop holds it now, and the transport's own fields."""
        assert self._loop is not None, "write_config comes after loop()"
        fleet = self._loop.ctx.fleet
        self.recorder.write_config({
            **self.cfg.model_dump(mode="json"),
            "resolved_options": self.method.options_dict(),
            **self.ending.config(),
            "fleet": {
                d: {"spec": r.spec.to_dict(), "num_samples": r.num_samples,
                    **({"profile": r.profile} if r.profile is not None else {})}
                for d, r in fleet.items()
            },
        })

    def run(self, ending: Ending | None = None, on_done: Callable[[ServerHalf], None] | None = None
            ) -> dict[str, Any]:
        """Config, the rounds, then the record: summary, plots, the models by ``ending``.
        Returns the summary; raises RunInterrupted (with it) after Ctrl-C."""
        loop = self._loop
        assert loop is not None, "run comes after loop()"
        self.ending = ending or Ending()
        self.write_config()
        final = loop.run()
        interrupted = bool(final["interrupted"])
        with second_interrupt_exits() if interrupted else contextlib.nullcontext():
            self.write_config()
            extra = self.ending.save_models(final)
            tiers = {d: r.spec.tier for d, r in loop.ctx.fleet.items()}
            summary = run_summary(self.cfg, final, self.rounds, tiers, **extra,
                                  wall_seconds=time.perf_counter() - self.started,
                                  run_dir=self.run_dir)
            finish_run(self.recorder, label_summary(summary), plots=self.plots)
            self.ending.ended(final, summary)
        if interrupted:
            raise RunInterrupted(f"{result_text(summary)}; the record is in {self.run_dir}",
                                 summary)
        if on_done:
            on_done(loop.server)
        return summary


def loop_settings(cfg: RunConfig, **transport: Any) -> LoopSettings:
    """The round loop's settings from the run configuration; ``transport``: what a transport
    sets beyond them (a fleet's name, deadlines, checkpoints)."""
    return LoopSettings(rounds=cfg.rounds, algorithm=cfg.algorithm, eval_every=cfg.eval_every,
                        buffer=cfg.buffer_size, **{"timeout": cfg.timeout, **transport})
