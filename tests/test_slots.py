"""Work slots: device processes of one machine take turns at local work, one per slot, and a
holder that dies gives its slot back."""

import multiprocessing
import os
import signal
import threading
from contextlib import contextmanager

import numpy as np
import pytest

from edgefl.algorithms import DeviceContext, TrainSettings, get_algorithm
from edgefl.data import load_dataset
from edgefl.errors import ConfigError
from edgefl.runtime.agent import DeviceAgent
from edgefl.runtime.fleet import device_command, work_slots
from edgefl.runtime.setup import fleet_specs
from edgefl.runtime.slots import WorkSlots, create_slots
from edgefl.wire import Envelope, Payload
from tests.conftest import tiny_config

pytestmark = pytest.mark.skipif(os.name != "posix", reason="work slots are POSIX file locks")


def _hold_until_told(folder, held, release):
    slots = WorkSlots(folder)
    with slots.hold():
        held.set()
        release.wait(60)


def _hold_forever(folder, held):
    slots = WorkSlots(folder)
    with slots.hold():
        held.set()
        threading.Event().wait()


def test_a_slot_held_by_another_process_is_waited_for(tmp_path):
    folder = create_slots(tmp_path / "slots", 1)
    ctx = multiprocessing.get_context("fork")
    held, release = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_hold_until_told, args=(folder, held, release))
    child.start()
    try:
        assert held.wait(60)
        mine = WorkSlots(folder)
        assert mine.try_hold() is None  # the other process holds the only slot
        release.set()
        with mine.hold():  # waits for the other's release, then holds
            assert WorkSlots(folder).try_hold() is None
        assert mine.waited >= 0.0
    finally:
        release.set()
        child.join(60)
    assert child.exitcode == 0


def test_a_holder_that_dies_gives_its_slot_back(tmp_path):
    folder = create_slots(tmp_path / "slots", 1)
    ctx = multiprocessing.get_context("fork")
    held = ctx.Event()
    child = ctx.Process(target=_hold_forever, args=(folder, held))
    child.start()
    assert held.wait(60)
    assert WorkSlots(folder).try_hold() is None
    os.kill(child.pid, signal.SIGKILL)  # killed mid-work: no release of its own
    child.join(60)
    assert WorkSlots(folder).try_hold() is not None  # the kernel dropped the dead holder's lock


def test_as_many_holders_as_slots_and_holders_in_one_process_apart(tmp_path):
    folder = create_slots(tmp_path / "slots", 2)
    a, b, c = WorkSlots(folder), WorkSlots(folder), WorkSlots(folder)  # e.g. three device threads
    fa, fb = a.try_hold(), b.try_hold()
    assert fa is not None and fb is not None
    assert c.try_hold() is None
    for slots in (a, b, c):
        slots.close()
    assert WorkSlots(folder).try_hold() is not None  # closed: given back


def test_a_folder_without_slots_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="no slot-"):
        WorkSlots(tmp_path)
    with pytest.raises(ConfigError, match="at least 1"):
        create_slots(tmp_path / "none", 0)


def test_the_agent_holds_its_slot_around_training_and_evaluation(tmp_path):
    # Prepare: a FedAvg device whose slot records when it is held
    cfg = tiny_config(tmp_path, algorithm="fedavg")
    train = load_dataset("synthetic", "train").subset(np.arange(64))
    test = load_dataset("synthetic", "test").subset(np.arange(32))
    spec = fleet_specs(cfg, ["d00"], train.info)["d00"]
    algo = get_algorithm("fedavg")
    half = algo.device(DeviceContext("d00", spec, train, TrainSettings(steps=2, batch_size=16),
                                     seed=0, rounds=2), algo.parse_options({}))
    holding, seen = [], []

    @contextmanager
    def slot():
        holding.append(True)
        try:
            yield
        finally:
            holding.pop()

    fit, evaluate = half.fit, DeviceAgent.evaluate
    half.fit = lambda r: (seen.append(("fit", bool(holding))), fit(r))[1]
    agent = DeviceAgent(half, eval_sets={"test": test}, algorithm="fedavg", work_slot=slot)
    agent.evaluate = lambda *a: (seen.append(("evaluate", bool(holding))),
                                 evaluate(agent, *a))[1]

    def request(kind, meta=None):
        return agent.handle(Envelope(kind=kind, round=1, device_id="d00", fleet="default",
                                     algorithm="fedavg", payload=Payload({}, meta or {})))

    # Execute: a training round and an evaluation
    update = request("train")
    metrics = request("evaluate")
    # Assert: each ran inside the slot, which was given back after it
    assert update.kind == "update" and metrics.kind == "metrics"
    assert seen == [("fit", True), ("evaluate", True)]
    assert holding == []


def test_a_simulated_fleet_gets_slots_only_where_its_devices_outnumber_the_cores(tmp_path):
    cores = os.cpu_count() or 1
    assert work_slots(tmp_path / "a", cores, 1, "cpu") is None  # they fit
    folder = work_slots(tmp_path / "b", cores + 1, 1, "cpu")
    assert folder is not None and len(list(folder.glob("slot-*"))) == cores
    cmd = device_command("mqtt://127.0.0.1:1883", "f", "d00", "synthetic", work_slots=folder)
    assert cmd[cmd.index("--work-slots") + 1] == str(folder)
    assert "--work-slots" not in device_command("mqtt://127.0.0.1:1883", "f", "d00", "synthetic")
