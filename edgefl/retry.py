"""Retries with capped exponential backoff: the one helper every caller that waits uses.

    backoff = Backoff(initial=1.0, factor=2.0, cap=30.0)      # 1, 2, 4, 8, 16, 30, 30, ...
    retry(lambda: connect(host), retry_on=(BrokerUnreachableError,), backoff=backoff,
          wait=60.0, on_retry=lambda attempt, delay, error: print(f"retry in {delay:g} s: {error}"))

``wait`` bounds the total time (None: forever, as a service waits for its broker); when it runs
out, the last error is raised. Sleeping and the clock are injectable so that tests need not wait.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from edgefl.errors import ConfigError

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """Delays ``initial * factor**k``, capped at ``cap`` seconds."""

    initial: float = 1.0
    factor: float = 2.0
    cap: float = 30.0

    def __post_init__(self) -> None:
        if not (self.initial > 0 and self.factor >= 1 and self.cap >= self.initial):
            raise ConfigError(
                f"backoff needs initial > 0, factor >= 1 and cap >= initial, got {self}"
            )

    def delay(self, attempt: int) -> float:
        """The delay after ``attempt`` earlier failures (0: the first delay)."""
        # 64: no float overflow
        return min(self.initial * self.factor ** min(attempt, 64), self.cap)

    def delays(self) -> Iterator[float]:
        return map(self.delay, itertools.count())


def retry(
    attempt: Callable[[], T],
    *,
    retry_on: tuple[type[BaseException], ...],
    backoff: Backoff = Backoff(),
    wait: float | None = None,
    on_retry: Callable[[int, float, BaseException], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """Call ``attempt`` until it returns; errors of ``retry_on`` are retried after the next
    backoff delay (never sleeping past ``wait`` seconds from the first call), other errors
    propagate at once. ``on_retry(attempt_number, delay, error)`` is told before each sleep."""
    if wait is not None and wait < 0:
        raise ConfigError(f"wait must be >= 0 seconds, got {wait}")
    end = None if wait is None else clock() + wait
    for number, delay in enumerate(backoff.delays(), start=1):
        try:
            return attempt()
        except retry_on as error:
            if end is not None:
                left = end - clock()
                if left <= 0:
                    raise
                delay = min(delay, left)
            if on_retry is not None:
                on_retry(number, delay, error)
            sleep(delay)
    raise AssertionError("unreachable: backoff delays never end")
