"""The one retry helper: capped exponential delays, a bounded total wait, a report per retry."""

import pytest

from edgefl.errors import BrokerUnreachableError, ConfigError
from edgefl.retry import Backoff, retry


class FakeTime:
    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def test_delays_grow_by_the_factor_and_stop_at_the_cap():
    delays = Backoff(initial=0.5, factor=2.0, cap=3.0).delays()
    assert [next(delays) for _ in range(6)] == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]
    # the k-th delay on its own (a caller that counts its failures), also far past the cap
    assert [Backoff(initial=0.5, factor=2.0, cap=3.0).delay(k) for k in (0, 2, 3, 10_000)] == [
        0.5,
        2.0,
        3.0,
        3.0,
    ]


@pytest.mark.parametrize("bad", [dict(initial=0), dict(factor=0.5), dict(initial=5, cap=1)])
def test_nonsense_backoff_is_refused(bad):
    with pytest.raises(ConfigError):
        Backoff(**bad)


def test_retries_until_the_attempt_succeeds_and_reports_each_retry():
    t, calls, told = FakeTime(), [], []

    def attempt():
        calls.append(t.now)
        if len(calls) < 4:
            raise BrokerUnreachableError("down")
        return "up"

    result = retry(
        attempt,
        retry_on=(BrokerUnreachableError,),
        backoff=Backoff(1, 2, 3),
        sleep=t.sleep,
        clock=t.clock,
        on_retry=lambda n, d, e: told.append((n, d, str(e))),
    )
    assert result == "up"
    assert t.sleeps == [1, 2, 3] and calls == [0, 1, 3, 6]
    assert told == [(1, 1, "down"), (2, 2, "down"), (3, 3, "down")]


def test_the_total_wait_is_bounded_and_the_last_error_is_raised():
    t = FakeTime()

    def attempt():
        raise BrokerUnreachableError(f"down at {t.now:g}")

    with pytest.raises(BrokerUnreachableError, match="down at 10"):
        retry(
            attempt,
            retry_on=(BrokerUnreachableError,),
            backoff=Backoff(1, 2, 4),
            wait=10,
            sleep=t.sleep,
            clock=t.clock,
        )
    assert t.sleeps == [1, 2, 4, 3]  # the last sleep is cut to the time left
    assert t.now == 10


def test_other_errors_are_not_retried():
    t = FakeTime()

    def attempt():
        raise ConfigError("bad URL")

    with pytest.raises(ConfigError):
        retry(attempt, retry_on=(BrokerUnreachableError,), sleep=t.sleep, clock=t.clock)
    assert t.sleeps == []
