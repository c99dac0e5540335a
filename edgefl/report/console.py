"""What a command tells its operator while it works: rich progress bars on a terminal, plain
lines everywhere else.

    from edgefl.report.console import err, Feedback

    with Feedback(err, rounds=12, quiet=quiet) as fb:
        summary = run(..., on_round=lambda r: fb.round_done(line_for(r)),
                      on_progress=fb.progress_hook)

On a terminal (and not ``--quiet``) a bar follows the rounds and another the exchange in
progress (training, evaluation, the final evaluation, devices registering: "2 of 6 registered:
pi-01, pi-02"); lines printed meanwhile scroll above the bars. When the output is a file, a pipe
or the journal there are no bars, no colours and no wrapping (a console that is not a terminal
would wrap at 80 columns and split a round's line in two): one line per round, one every few seconds
while devices register (and when the last one did), one when the final evaluation starts.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console

#: Width of a console that is not a terminal: tables are laid out to it; text never wraps.
PLAIN_WIDTH = 200


def make_console(stderr: bool = False) -> Console:
    """A console that never wraps a line when its output is not a terminal."""
    probe = Console(stderr=stderr)
    if probe.is_terminal:
        return probe
    width = int(os.environ["COLUMNS"]) if os.environ.get("COLUMNS", "").isdigit() else PLAIN_WIDTH
    return Console(stderr=stderr, soft_wrap=True, width=width)


#: The commands' consoles: results on stdout (``out``), everything else on stderr (``err``).
err = make_console(stderr=True)
out = make_console(stderr=False)


def log_handler(console: Console = err) -> logging.Handler:
    """Log records as rich lines on a terminal; plain ``LEVEL name: message`` lines elsewhere
    (journald adds its own time stamp)."""
    if console.is_terminal:
        from rich.logging import RichHandler

        return RichHandler(console=console, show_path=False)
    handler = logging.StreamHandler(console.file)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    return handler


STAGES = {"register": "devices registering", "train": "training", "evaluate": "evaluating",
          "finish": "sending the final models", "final": "final evaluation", "export": "exporting"}


# seconds between plain "waiting for devices" lines (the last one always comes)
REGISTER_EVERY = 5.0


def names_line(names: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


class Feedback:
    """Progress of one long command. Thread-safe (progress arrives on network threads)."""

    def __init__(
        self,
        console: Console = err,
        *,
        rounds: int | None = None,
        quiet: bool = False,
        what: str = "rounds",
    ):
        self.console, self.quiet, self.rounds, self.what = console, quiet, rounds, what
        self.bars = console.is_terminal and not quiet
        self.lock = threading.Lock()
        self.progress = None
        self.round_task = self.step_task = None
        self.step_key: tuple[str, int | None] | None = None  # the exchange the step bar shows
        self.last_plain: str | None = None
        self.clock = time.monotonic
        self.last_register = float("-inf")  # when a plain "waiting for devices" line was printed

    # -- lifetime ------------------------------------------------------------------------------
    def __enter__(self) -> Feedback:
        if self.bars:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )

            self.progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            )
            self.progress.start()
            if self.rounds:
                self.round_task = self.progress.add_task(self.what, total=self.rounds)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def start_rounds(self, total: int) -> None:
        """The number of rounds became known (a device learns it when it registers)."""
        with self.lock:
            if self.progress is None:
                return
            if self.round_task is None:
                self.round_task = self.progress.add_task(self.what, total=total)
            else:
                self.progress.reset(self.round_task, total=total)

    # -- what the commands report --------------------------------------------------------------
    def line(self, text: str, *, always: bool = False, markup: bool = True) -> None:
        """A line above the bars (or a plain line); ``--quiet`` drops it unless ``always``."""
        if self.quiet and not always:
            return
        self.console.print(text, highlight=False, markup=markup)

    def round_done(self, text: str | None = None) -> None:
        """One more round is complete; ``text`` is its line."""
        if text is not None:
            self.line(text)
        with self.lock:
            if self.progress is not None and self.round_task is not None:
                self.progress.advance(self.round_task)

    def progress_hook(self, stage: str, round: int | None = None, done: int = 0, total: int = 0,
                      names: Iterable[str] = ()) -> None:
        """The library's ``on_progress``: ``done`` of ``total`` (devices that answered an
        exchange, devices registered, models exported). Stages: register, train, evaluate,
        finish, final, export."""
        names = sorted(names)
        if stage == "register":
            text = f"waiting for devices: {done} of {total} registered" + (
                f": {names_line(names)}" if names else ""
            )
        elif stage == "export":
            text = f"exporting {names_line(names)} ({done + 1} of {total})" if names else "exported"
        elif stage in ("train", "evaluate") and round is not None:
            text = f"round {round}: {STAGES[stage]}"
        else:
            text = STAGES.get(stage, stage)
        with self.lock:
            if self.progress is not None:
                if self.step_task is None:
                    self.step_task = self.progress.add_task(text, total=total or None)
                # a new exchange: its clock starts now
                if done == 0 and (stage, round) != self.step_key:
                    self.progress.reset(self.step_task, description=text, total=total or None)
                else:
                    self.progress.update(
                        self.step_task, description=text, total=total or None, completed=done
                    )
                self.step_key = (stage, round)
                return
            # plain: the lines that matter to someone reading a log, never one per reply
            if self.quiet:
                return
            if stage == "final" and done == 0:
                text = f"final evaluation: {total} devices"
            elif stage == "register":
                # a large fleet registers one device at a time: a line every few seconds, and the
                # last
                now = self.clock()
                if done < total and now - self.last_register < REGISTER_EVERY:
                    return
                self.last_register = now
            elif not (stage == "export" and names):
                return
            if text == self.last_plain:
                return
            self.last_plain = text
        self.console.print(text, highlight=False, markup=False)
