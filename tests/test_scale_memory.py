"""What a device held in memory costs: its model, not gradients, CUDA seeding or a heap that
keeps what devices free."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from edgefl.algorithms.base import TrainSettings, cpu_seeded
from edgefl.algorithms.training import train_local
from edgefl.data import ArrayDataset, DatasetInfo
from edgefl.models import ModelSpec, build_model
from edgefl.runtime.heap import FLEET, fixed_mmap_threshold

SPEC = ModelSpec(family="cnn", tier="2", num_classes=10, in_shape=(1, 28, 28), width=0.25)


def test_cpu_seeding_builds_the_model_torch_manual_seed_builds_and_restores_the_generator():
    with torch.random.fork_rng():
        torch.manual_seed(1234)
        reference = build_model(SPEC).state_dict()
    before = torch.default_generator.get_state()
    with cpu_seeded(1234):
        model = build_model(SPEC).state_dict()
    assert torch.equal(torch.default_generator.get_state(), before)
    for k, v in reference.items():
        assert torch.equal(model[k], v), k


def test_local_training_leaves_no_gradients_behind():
    info = DatasetInfo(name="t", num_classes=10, in_shape=(1, 28, 28), mean=(0.5,), std=(0.5,),
                       class_names=tuple(str(i) for i in range(10)))
    g = torch.Generator().manual_seed(0)
    data = ArrayDataset(torch.randint(0, 256, (40, 1, 28, 28), dtype=torch.uint8, generator=g),
                        torch.randint(0, 10, (40,), generator=g), info)
    model = build_model(SPEC)
    stats = train_local(model, data, TrainSettings(steps=2, batch_size=16), 0,
                        np.random.default_rng(0))
    assert stats["samples_seen"] == 32
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_mmap_threshold_is_pinned_on_glibc():
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("not glibc")
    assert fixed_mmap_threshold() is True


HEAP = textwrap.dedent("""
    import ctypes, json, sys
    from edgefl.runtime.heap import fleet_heap

    class Info(ctypes.Structure):  # glibc's struct mallinfo2
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                    "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    def resident():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = Info
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    own = fleet_heap(int(sys.argv[1]))
    before = libc.mallinfo2().hblks
    blocks = [libc.malloc(100 * 1024) for _ in range(80)]  # 64 KiB < 100 KiB < 128 KiB
    mapped = libc.mallinfo2().hblks - before
    for b in blocks:
        ctypes.memset(b, 1, 100 * 1024)
    held = libc.malloc(120 * 1024)  # above them (no hole fits it): the top stays up
    for b in blocks:
        libc.free(b)
    kept = resident()
    reply = own(lambda x: x + 1)(41)  # a device's exchange
    print(json.dumps([mapped, kept - resident(), reply]))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
@pytest.mark.parametrize("devices", [1, FLEET - 1, FLEET, 10 * FLEET])
def test_a_fleet_pins_the_threshold_a_smaller_one_trims_after_each_exchange(devices):
    """From FLEET devices a 100 KiB block gets a mapping of its own (the threshold pinned at
    64 KiB); below, it comes from the heap (glibc's dynamic threshold) and a device's exchange
    gives the heap's free pages back (malloc_trim) and returns the handler's reply."""
    import platform

    libc, version = platform.libc_ver()
    if libc != "glibc" or tuple(map(int, version.split(".")[:2])) < (2, 33):
        pytest.skip("mallinfo2 needs glibc 2.33")
    out = subprocess.run([sys.executable, "-c", HEAP, str(devices)], capture_output=True,
                         text=True, check=True, timeout=120)
    mapped, released, reply = json.loads(out.stdout.strip().splitlines()[-1])
    assert reply == 42
    if devices >= FLEET:
        assert mapped == 80
    else:
        assert mapped == 0
        assert released > 6 * 2**20, released  # most of the 8 MB freed


def test_an_exchange_is_trimmed_after_once_the_interval_has_passed_since_the_last_trim(
        monkeypatch):
    """Exchanges of real local work (longer than the interval) are each followed by a trim;
    shorter ones share one per interval; every reply comes back."""
    from edgefl.runtime import heap

    trims: list[float] = []
    now = [100.0]  # the clock: each handler below says how long its exchange takes
    monkeypatch.setattr(heap, "malloc_trim", lambda: lambda pad: trims.append(now[0]) or 0)
    own = heap.fleet_heap(10, interval=1.0, clock=lambda: now[0])

    def exchange(seconds):
        def handler(x):
            now[0] += seconds
            return x * 2

        return own(handler)

    assert [exchange(2.0)(i) for i in range(3)] == [0, 2, 4]
    assert trims == [102.0, 104.0, 106.0]  # each one longer than the interval: each trimmed
    assert [exchange(0.4)(i) for i in range(7)] == [0, 2, 4, 6, 8, 10, 12]
    # ending at 106.4, 106.8: untrimmed; 107.2 trims; 107.6, 108.0 not; 108.4 trims; 108.8 not
    assert trims[3:] == pytest.approx([107.2, 108.4])


def test_trims_take_no_more_than_their_share_of_the_time(monkeypatch):
    """A trim that takes long (a large heap's) makes the next wait: with a share of 1/20, a trim of
    0.5 s is followed by none for 9.5 s; one that takes nothing again waits the interval only."""
    from edgefl.runtime import heap

    trims: list[float] = []
    now = [0.0]
    cost = [0.5]  # what a trim takes on the clock

    def trim(pad):
        trims.append(now[0])
        now[0] += cost[0]
        return 0

    monkeypatch.setattr(heap, "malloc_trim", lambda: trim)

    def handler(x):
        now[0] += 1.0  # each exchange takes a second
        return x + 1

    wrapped = heap.fleet_heap(10, interval=0.5, share=0.05, clock=lambda: now[0])(handler)
    assert [wrapped(i) for i in range(12)] == list(range(1, 13))
    # a trim at 1.0 (it ends at 1.5: the next may come 9.5 s later) and at 11.5
    assert trims == [1.0, 11.5]
    cost[0] = 0.0
    assert wrapped(0) == 1 and wrapped(0) == 1  # ending at 14.0 and 15.0: no trim
    # the trim at 11.5 ended at 12.0 and took 0.5 s: the exchange ending 21.5 trims (free this
    # time), and from there the interval alone applies: the next exchange, a second on, trims
    now[0] = 20.5
    assert wrapped(0) == 1 and wrapped(0) == 1
    assert trims[2:] == [21.5, 22.5]
    with pytest.raises(ValueError, match="share"):
        heap.fleet_heap(10, share=0.0)


CHILD = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import psutil
    from tests.conftest import tiny_config
    from edgefl.runtime.heap import fixed_mmap_threshold
    from edgefl.runtime.simulation import simulate

    fixed_mmap_threshold()  # both fleets on the heap of a large one (edgefl.runtime.heap)
    held = []  # resident memory after the round: every device built, trained, its uplink averaged
    for i, n in enumerate((20, 20, 220)):  # the first warms what every run needs once
        cfg = tiny_config(Path(sys.argv[1]), clients=n, rounds=1, steps=1, train_samples=2000,
                          min_size=1, eval_samples=20, test_samples=20, threads=1,
                          run_name=f"run{i}")
        simulate(cfg, lambda r: held.append(psutil.Process().memory_info().rss), plots=False)
    print(json.dumps(held[1:]))
""")


def test_two_hundred_more_devices_in_memory_cost_a_bounded_amount_each(tmp_path):
    """200 more devices in memory, after their round (built, trained, uplinks averaged), hold
    their models (45 kB: CNN tier 2 at width 0.25) and the objects around them. A device that
    kept its gradients, optimizer state, a copy of the data or a history per round would cross
    the bound."""
    out = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True,
                         text=True, check=True, timeout=900)
    small, large = json.loads(out.stdout.strip().splitlines()[-1])
    model_bytes = sum(t.numel() * 4 for t in build_model(SPEC).state_dict().values())
    per_device = (large - small) / 200
    assert model_bytes < per_device < 300_000, (per_device, model_bytes)
