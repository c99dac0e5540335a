"""The chunk protocol without a broker: splitting and reassembly, duplicates and reordering, the
receivers' byte budget, and hostile headers refused before any allocation (the sender's side:
tests/test_chunk_sender.py; the network both use: tests/chunk_cases.py)."""

import random
import struct
import tracemalloc
import zlib

import numpy as np
import pytest

from edgefl.errors import WireError
from edgefl.transport.chunks import (
    COMPLETE,
    HEADER,
    MAGIC,
    PIECE_OVERHEAD,
    PROGRESS,
    REFUSED,
    ChunkRefused,
    ChunkSettings,
    Reassembler,
    is_ack,
    is_chunk,
    parse_ack,
    split,
)
from edgefl.wire import Envelope, Payload, decode, encode
from edgefl.wire.validate import peek
from tests.chunk_cases import MAX, MID, Clock, Link, add_all, payload, settings
from tests.conftest import wait_until

# --- format ---------------------------------------------------------------------------------------


def test_chunks_split_and_reassemble_in_order_into_the_same_bytes():
    data = payload(1234)
    chunks = split(data, MID, 100)
    assert len(chunks) == 13 and all(is_chunk(c) for c in chunks)
    assert [len(c) - HEADER.size for c in chunks] == [100] * 12 + [34]
    r = Reassembler(settings(), max_bytes=MAX)
    for i, c in enumerate(chunks[:-1]):
        message, ack = r.add("a", c)
        assert message is None
        assert parse_ack(ack) == (MID, i + 1, 0, PROGRESS)
    message, ack = r.add("a", chunks[-1])
    assert message == data and parse_ack(ack)[3] == COMPLETE
    assert r.partial_bytes == 0 and not r.partial


def test_a_chunk_is_never_read_as_an_envelope_and_an_envelope_never_as_a_chunk():
    env = encode(
        Envelope(
            "update",
            1,
            "d1",
            fleet="f",
            payload=Payload({"w": np.ones(300, np.float32)}, {"num_samples": 1}),
        )
    )
    chunk = split(env, MID, 100)[0]
    with pytest.raises(WireError):
        peek(chunk)
    with pytest.raises(WireError):
        decode(chunk)
    assert not is_chunk(env) and not is_ack(env)
    assert struct.unpack("<Q", MAGIC)[0] > (1 << 40)  # as a safetensors header length: absurd


def test_out_of_order_and_duplicate_chunks_reassemble_once_with_selective_acks():
    data = payload(1000)
    chunks = split(data, MID, 100)
    r = Reassembler(settings(), max_bytes=MAX)
    _, ack = r.add("a", chunks[3])
    assert parse_ack(ack) == (MID, 0, 0b100, PROGRESS)  # chunk 3 = next(0) + 1 + bit 2
    order = [9, 0, 0, 5, 1, 2, 3, 8, 7, 6, 5]
    out = []
    for i in order:
        message, _ = r.add("a", chunks[i])
        out.append(message)
    message, ack = r.add("a", chunks[4])
    assert out == [None] * len(order) and message == data
    assert r.stats.duplicates == 3 and r.stats.completed == 1
    # a chunk of a finished message is acknowledged as complete, never delivered again
    again, ack = r.add("a", chunks[2])
    assert again is None and parse_ack(ack)[3] == COMPLETE


def test_a_reassembled_envelope_goes_through_the_ordinary_decoder():
    env = Envelope(
        "update",
        1,
        "d1",
        fleet="f",
        payload=Payload({"w": np.arange(5000, dtype=np.float32)}, {"num_samples": 3}),
    )
    r = Reassembler(settings(), max_bytes=MAX)
    chunks = split(encode(env), MID, 1000)
    random.Random(0).shuffle(chunks)
    message = None
    for c in chunks:
        message, _ = r.add("a", c) if message is None else (message, None)
    back = decode(message)
    assert back.message_id == env.message_id and np.array_equal(
        back.payload.arrays["w"], env.payload.arrays["w"]
    )


# --- refusals -------------------------------------------------------------------------------------


def forged(
    mid=MID, index=0, count=1, total=10, chunk_size=10, crc=0, body=b"x" * 10, chunk_crc=None
):
    cc = zlib.crc32(body) if chunk_crc is None else chunk_crc
    return HEADER.pack(MAGIC, mid, index, count, total, chunk_size, crc, cc) + body


@pytest.mark.parametrize(
    ("chunk", "reason"),
    [
        (forged(count=2**32 - 1, total=2**63, chunk_size=1), "limit"),  # a huge size
        # count inconsistent with size
        (forged(count=2**32 - 1, total=MAX, chunk_size=1), "chunk count"),
        (forged(count=2**32 - 1, total=MAX, chunk_size=2**32 - 1), "chunk size"),
        (forged(count=1, total=MAX + 1, chunk_size=MAX + 1), "limit"),
        (forged(count=0, total=0, chunk_size=10), "limit"),
        (forged(index=5, count=1), "index 5 of 1"),
        (forged(count=2, total=20, chunk_size=10, body=b"x" * 7), "carries 7 bytes"),
        (forged(chunk_crc=123), "checksum"),
        (MAGIC + b"\0" * 10, "shorter than"),
        (b"NOTCHUNK" + b"\0" * HEADER.size, "not a chunk"),
    ],
)
def test_hostile_chunk_headers_are_refused_before_anything_is_allocated(chunk, reason):
    r = Reassembler(settings(max_chunk_size=4096), max_bytes=MAX)
    tracemalloc.start()
    try:
        with pytest.raises(WireError, match=reason):
            r.add("a", chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024, peak
    assert r.stats.rejected == 1 and r.partial_bytes == 0 and not r.partial


def test_memory_is_taken_as_bytes_arrive_and_a_real_message_is_kept():
    s = settings(chunk_size=1000, max_chunk_size=1000, max_partial_bytes=50_000)
    r = Reassembler(s, max_bytes=MAX)
    data = payload(30_000)
    real = split(data, MID, 1000)
    assert r.add("a", real[0])[0] is None
    tracemalloc.start()
    try:
        # another sender claims the largest message: it costs what it carries, not what it claims
        r.add(
            "b",
            forged(
                mid=b"\1" * 16, count=MAX // 1000 + 1, total=MAX, chunk_size=1000, body=b"y" * 1000
            ),
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024 and r.held["b"] == 1000 + PIECE_OVERHEAD
    assert add_all(r, "a", real[1:]) == data


def budgeted(partial_bytes: int, sender_bytes: int) -> Reassembler:
    """A reassembler of 1000-byte chunks that holds at most ``partial_bytes`` of unfinished
    messages, ``sender_bytes`` of them from any one sender."""
    s = settings(chunk_size=1000, max_chunk_size=1000, max_partial_bytes=partial_bytes,
                 max_sender_bytes=sender_bytes)
    return Reassembler(s, max_bytes=MAX)


def test_a_sender_over_its_share_is_refused_while_others_keep_their_room():
    r = budgeted(10_000, 4_000)
    hog = split(payload(9_000), b"\3" * 16, 1000)
    for c in hog[:3]:
        r.add("hog", c)
    with pytest.raises(WireError, match="its share is 4000"):
        r.add("hog", hog[3])
    assert r.stats.over_share == 1 and r.held["hog"] == 3 * (1000 + PIECE_OVERHEAD)
    data = payload(3_000)
    assert add_all(r, "honest", split(data, MID, 1000)) == data


def test_a_full_budget_is_shared_the_largest_holder_gives_way():
    r = budgeted(7_000, 7_000)
    hogs = [split(payload(8_000), bytes([k]) * 16, 1000) for k in range(2)]
    for chunks in hogs:  # two partials of 2 chunks each: 4,512 bytes held
        for c in chunks[:2]:
            r.add("hog", c)
    data = payload(3_000)
    # needs 3,384 more: the hog's oldest partial is evicted
    message = add_all(r, "honest", split(data, MID, 1000))
    assert message == data and r.stats.evicted == 1 and len(r.partial["hog"]) == 1
    # a sender holding more than the others may not evict them to grow further
    r.add("small", split(payload(2_000), b"\7" * 16, 1000)[0])
    with pytest.raises(WireError, match="no room"):
        for c in hogs[1][2:]:
            r.add("hog", c)
    assert "small" in r.partial and r.partial_bytes <= 7_000


def test_forged_first_chunks_claiming_the_maximum_from_two_accounts_leave_a_third_device_its_room():
    """Issue 36's chunk test, at the real defaults (256 MiB messages, 1 MiB chunks, 1 GiB
    budget)."""
    limit = 256 * 1024 * 1024
    s = ChunkSettings()
    r = Reassembler(s, max_bytes=limit)
    size = s.chunk_size
    count = limit // size
    rss = _rss()
    for k, sender in enumerate(["mallory", "mallory", "trudy", "trudy"]):
        r.add(
            sender,
            forged(
                mid=bytes([k]) * 16,
                count=count,
                total=limit,
                chunk_size=size,
                body=bytes([k]) * size,
            ),
        )
    grew = _rss() - rss
    assert grew < 50 * 1024 * 1024, grew
    data = payload(5 * size + 123)
    message = None
    for c in split(data, MID, size):
        message, ack = r.add("honest", c)
    assert message == data and parse_ack(ack)[3] == COMPLETE
    assert r.stats.rejected == 0 and set(r.partial) == {"mallory", "trudy"}
    r.close()


def _rss() -> int:
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_partials_expire_on_a_timer_without_new_traffic():
    r = Reassembler(settings(idle_after=0.2), max_bytes=MAX)
    r.add("gone", split(payload(300), MID, 100)[0])
    wait_until(lambda: not r.partial, "the idle partial to be dropped", timeout=30, poll=0.02)
    assert not r.partial and r.partial_bytes == 0 and r.stats.evicted == 1
    r.close()
    assert not r.thread.is_alive()


def test_an_inconsistent_chunk_is_refused_and_never_displaces_the_real_message():
    data = payload(500)
    chunks = split(data, MID, 100)
    r = Reassembler(settings(), max_bytes=MAX)
    r.add("a", chunks[0])
    liar = split(payload(600), MID, 100)[1]  # same id, another total and checksum
    with pytest.raises(WireError, match="disagrees"):
        r.add("a", liar)
    with pytest.raises(WireError, match="checksum"):  # chunk 1 with a flipped byte
        bad = bytearray(chunks[1])
        bad[-1] ^= 1
        r.add("a", bytes(bad))
    assert add_all(r, "a", chunks[1:]) == data and r.stats.rejected == 2


def test_a_whole_message_that_fails_its_checksum_is_refused_and_its_sender_told():
    body = [b"a" * 10, b"b" * 10]
    chunks = [forged(index=i, count=2, total=20, crc=12345, body=b) for i, b in enumerate(body)]
    r = Reassembler(settings(), max_bytes=MAX)
    r.add("a", chunks[0])
    with pytest.raises(ChunkRefused, match="fails its checksum") as e:
        r.add("a", chunks[1])
    assert parse_ack(e.value.ack)[3] == REFUSED and r.partial_bytes == 0 and r.stats.completed == 0
    # the sender of the refused message stops
    link = Link()
    link.sender.send("d/down", payload(300), MID, on_done=link.done.append)
    link.sender.on_ack("d/down", e.value.ack)
    assert link.done == [False] and link.sender.stats.refused == 1 and link.sender.inflight == 0


def test_each_sender_holds_a_bounded_number_of_partial_messages_and_others_are_untouched():
    r = Reassembler(settings(max_partial_per_sender=2), max_bytes=MAX)
    other = split(payload(300), b"\x09" * 16, 100)
    r.add("b", other[0])
    for k in range(5):  # sender a starts five messages; it keeps the last two
        r.add("a", split(payload(300), bytes([k]) * 16, 100)[0])
    assert (
        len(r.partial["a"]) == 2
        and r.stats.evicted == 3
        and r.partial_bytes == 3 * (100 + PIECE_OVERHEAD)
    )
    assert add_all(r, "b", other[1:]) is not None
    assert r.drop_idle(-1) == 2 and r.partial_bytes == 0


def test_a_reassembly_whose_sender_vanished_is_dropped_when_idle():
    clock = Clock()
    r = Reassembler(settings(idle_after=100.0), max_bytes=MAX, clock=clock, timer=False)
    live = split(payload(300), b"\x02" * 16, 100)
    r.add("gone", split(payload(300), b"\x01" * 16, 100)[0])
    clock.t = 50.0
    r.add("live", live[0])
    # 50 s idle: kept
    assert r.drop_idle(100.0) == 0 and r.partial_bytes == 2 * (100 + PIECE_OVERHEAD)
    clock.t = 120.0
    r.add("live", live[1])
    assert r.drop_idle(100.0) == 1
    assert (
        set(r.partial) == {"live"}
        and r.partial_bytes == 2 * (100 + PIECE_OVERHEAD)
        and r.stats.evicted == 1
    )
