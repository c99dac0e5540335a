"""What the conformance suite's files share: the registry's methods, a run's configuration (3
devices, 2 rounds, small work), the in-memory fleet of a run, and torch's thread count restored
after each test (import `_restore_torch_threads` into a test module to have it there)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from edgefl.algorithms import DeviceRecord, algorithm_names
from edgefl.runtime.agent import DeviceAgent
from edgefl.runtime.setup import assemble
from edgefl.transport import InMemoryTransport
from tests.conftest import SMALL_WORK, tiny_config

METHODS = algorithm_names()


def conformance_config(tmp_path: Path, name: str, options: dict | None = None, **overrides):
    """3 devices, 2 rounds of 2 steps of 8 samples, every device every round, one torch thread
    (as a device process); the method's small-work options and ``options``."""
    settings = {
        "clients": 3,
        "rounds": 2,
        "steps": 2,
        "batch_size": 8,
        "test_samples": 100,
        "fraction": 1.0,
        "threads": 1,
    }
    return tiny_config(
        tmp_path,
        algorithm=name,
        options={**SMALL_WORK.get(name, {}), **(options or {})},
        **{**settings, **overrides},
    )


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def memory_fleet(cfg):
    """The simulation's parties, by the run assembly, with the in-memory transport."""
    run = assemble(cfg)
    transport = InMemoryTransport()
    halves, fleet = {}, {}
    for d in run.ids:
        halves[d] = run.device_half(d)
        transport.connect(
            d, DeviceAgent(halves[d], eval_sets=run.data.evals, algorithm=cfg.algorithm).handle
        )
        fleet[d] = DeviceRecord(run.specs[d], len(halves[d].ctx.train_data))
    return run, transport, halves, fleet
