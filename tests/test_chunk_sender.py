"""The chunk protocol's sender without a broker: acks checked, loss, duplicates and reordering
survived, a window and a byte budget, re-sends driven by progress, stalls backed off and given
up."""

import random

import numpy as np
import pytest

from edgefl.errors import WireError
from edgefl.transport.chunks import (
    ACK,
    PROGRESS,
    ChunkHeader,
    ChunkSettings,
    pack_ack,
    parse_ack,
)
from tests.chunk_cases import MID, Link, payload, settings


def test_malformed_acks_are_refused():
    link = Link()
    link.sender.send("d/down", payload(300), MID)
    with pytest.raises(WireError):
        link.sender.on_ack("d/down", b"EFLCACK1" + b"\0" * 3)
    with pytest.raises(WireError, match="names chunk 9"):
        link.sender.on_ack("d/down", pack_ack(MID, 9, 0, PROGRESS))
    with pytest.raises(WireError):
        parse_ack(ACK.pack(b"EFLCACK1", MID, 0, 0, 7))
    assert link.sender.stats.rejected_acks == 2  # the last went to parse_ack alone


def test_a_lossless_transfer_sends_every_chunk_once():
    link = Link()
    data = payload(2345)
    link.run(data)
    assert link.delivered == [data] and link.done == [True]
    assert (
        link.sender.stats.chunks == 24
        and link.sender.stats.resent == 0
        and link.sender.inflight == 0
    )


@pytest.mark.parametrize("seed", range(5))
def test_lost_duplicated_and_reordered_chunks_still_arrive_whole(seed):
    rng = random.Random(seed)
    link = Link(drop=lambda topic, data: rng.random() < 0.2)

    def shuffle_and_duplicate(batch):
        batch.extend(rng.sample(batch, len(batch) // 3))
        rng.shuffle(batch)

    data = payload(5000)
    link.sender.send("d/down", data, MID, on_done=link.done.append)
    for _ in range(2000):
        if link.done:
            break
        link.deliver(order=shuffle_and_duplicate)
        link.clock.t += 0.5
        link.sender.poll()
    assert link.delivered == [data] and link.done == [True]
    assert link.sender.stats.resent > 0  # something was lost and came again
    assert link.receiver.stats.duplicates > 0


def test_the_window_bounds_unacknowledged_chunks_per_destination_and_the_budget_all_of_them():
    s = settings(window=4, chunk_size=100, max_inflight_bytes=1000)
    link = Link(s)
    for k in range(5):  # five destinations, acks held back
        link.sender.send(f"d{k}/down", payload(5000), bytes([k]) * 16)
    per_dest = {}
    for topic, _ in link.wire:
        per_dest[topic] = per_dest.get(topic, 0) + 1
    assert max(per_dest.values()) <= 4
    # the budget: 10 chunks of 100
    assert sum(per_dest.values()) == 10 and link.sender.inflight == 1000
    assert link.sender.stats.peak_inflight_bytes == 1000
    # acknowledging frees budget and the transfers go on, never above it
    for _ in range(500):
        if not link.wire:
            break
        link.deliver(n=3)
        assert link.sender.inflight <= 1000
    assert len(link.delivered) == 5 and link.sender.stats.resent == 0


def test_a_slow_transfer_that_keeps_progressing_is_never_resent():
    """Acks trickle in, each just before the stall time: the transfer takes 60× the stall time
    and no chunk goes twice (a fixed timeout would have fired long before)."""
    s = settings(window=2, stall_after=1.0, assumed_rate=1e9)
    link = Link(s)
    data = payload(6000)  # 60 chunks
    link.sender.send("d/down", data, MID, on_done=link.done.append)
    while not link.done:
        link.clock.t += 0.9 * link.sender.stall_time(next(iter(link.sender.transfers.values())))
        link.sender.poll()
        link.deliver(n=1)
    assert link.clock.t > 50 and link.sender.stats.resent == 0 and link.delivered == [data]


def test_a_stalled_transfer_backs_off_and_is_given_up():
    s = settings(stall_after=1.0, assumed_rate=1e9, max_stalls=3, max_stall=100)
    link = Link(s, drop=lambda topic, data: True)  # the receiver is gone
    link.sender.send("d/down", payload(500), MID, on_done=link.done.append)
    resend_times = []
    for _ in range(400):
        link.clock.t += 0.25
        before = link.sender.stats.stalls
        link.sender.poll()
        if link.sender.stats.stalls > before:
            resend_times.append(link.clock.t)
        if link.done:
            break
    gaps = np.diff([0.0, *resend_times])
    assert link.done == [False] and link.sender.stats.given_up == 1 and link.sender.inflight == 0
    assert list(np.round(gaps[:3])) == [1, 2, 4]  # doubling without progress


def test_the_stall_time_grows_with_the_bytes_in_flight_at_the_measured_rate():
    s = settings(
        window=8, chunk_size=100, max_inflight_bytes=100_000, stall_after=1.0, assumed_rate=100.0
    )
    link = Link(s)
    link.sender.send("d/down", payload(800), MID)
    out = next(iter(link.sender.transfers.values()))
    assert link.sender.inflight == 800
    assert link.sender.stall_time(out) == pytest.approx(1.0 + 800 / 100.0)
    # acks measured at 1,000 bytes/s: the stall time follows the measurement
    for _ in range(4):
        link.clock.t += 0.1
        link.deliver(n=1)
    assert link.sender.rate == pytest.approx(1000, rel=0.01)
    assert link.sender.stall_time(out) == pytest.approx(
        1.0 + link.sender.inflight / link.sender.rate
    )


def test_settings_refuse_a_window_beyond_the_selective_ack():
    with pytest.raises(ValueError):
        ChunkSettings(window=65)
    with pytest.raises(ValueError):
        ChunkSettings(chunk_size=10, max_inflight_bytes=5)
    assert ChunkHeader(MID, 2, 3, 250, 100, 0, 0).span() == (200, 250)


def test_a_receiver_that_pauses_between_acks_lengthens_the_stall_time():
    """Acks that came 3 s apart (a receiver busy decoding) make the next stall time at least 6 s,
    then the pause is forgotten slowly (×0.9 per progressing ack)."""
    s = settings(window=2, stall_after=1.0, assumed_rate=1e12)
    link = Link(s)
    link.sender.send("d/down", payload(1000), MID)
    out = next(iter(link.sender.transfers.values()))
    assert link.sender.stall_time(out) == pytest.approx(1.0)
    link.clock.t += 3.0
    link.deliver(n=1)
    assert link.sender.stall_time(out) == pytest.approx(6.0)
    for _ in range(5):
        link.clock.t += 0.01
        link.deliver(n=1)
    assert link.sender.stall_time(out) == pytest.approx(6.0 * 0.9**5)
    assert link.sender.stats.resent == 0
