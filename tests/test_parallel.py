"""The in-memory simulation on worker processes: the same run as the sequential one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from edgefl.errors import EdgeflError, WireError
from edgefl.runtime import parallel as parallel_module
from edgefl.runtime import simulation
from edgefl.runtime.parallel import WorkerPool, device_groups
from edgefl.runtime.setup import device_ids
from edgefl.wire import Envelope, Payload, decode, encode
from tests.conftest import tiny_config


def sequential_and(cfg, name: str, **how) -> tuple[dict, dict, list[dict]]:
    """``cfg`` simulated in memory twice: one device after another (run ``seq``), then as ``how``
    says (run ``name``); the two summaries and the two final server states."""
    states: list[dict] = []
    runs = [
        simulation.simulate(cfg.model_copy(update={"run_name": run_name}), plots=False,
                            on_done=lambda s: states.append(s.state_dict()), **kw)
        for run_name, kw in (("seq", {}), (name, how))
    ]
    return runs[0], runs[1], states


def _rounds(summary) -> list[dict]:
    return [
        json.loads(line)
        for line in (Path(summary["run_dir"]) / "rounds.jsonl").read_text().splitlines()
    ]


# FedAvg (weights averaged by the server) and FedProto (knowledge only; dropout masks drawn from
# torch's generator, seeded per device and round): two workers hold d00, d02 and d01.
@pytest.mark.parametrize(("algorithm", "extra"), [("fedavg", {}), ("fedproto", {"fraction": 0.67})])
def test_two_workers_give_the_sequential_run(tmp_path, algorithm, extra):
    # one torch thread per device in both: the same floating-point reductions
    cfg = tiny_config(tmp_path, algorithm=algorithm, threads=1, **extra)
    sequential, parallel, states = sequential_and(cfg, "par", workers=2)
    # the same workers serve the next run of this process, with the same results
    reused = set(parallel_module.idle_pids())
    assert len(reused) == 2
    again = simulation.simulate(cfg.model_copy(update={"run_name": "again"}), plots=False,
                                workers=2, on_done=lambda s: states.append(s.state_dict()))
    assert set(parallel_module.idle_pids()) == reused

    assert parallel["client_accuracy"] == sequential["client_accuracy"] == again["client_accuracy"]
    assert set(states[0]) == set(states[1]) == set(states[2])
    for k in states[0]:
        np.testing.assert_array_equal(states[1][k], states[0][k], err_msg=k)
        np.testing.assert_array_equal(states[2][k], states[0][k], err_msg=k)
    seq_rounds, par_rounds = _rounds(sequential), _rounds(parallel)
    for a, b in zip(seq_rounds, par_rounds, strict=True):
        assert b["selected"] == a["selected"] and b["completed"] == a["completed"]
        assert b["train_loss"] == a["train_loss"]
        # same replies; their sizes differ only by the digits of the measured train_seconds
        assert all(abs(b["bytes_up"][d] - a["bytes_up"][d]) <= 16 for d in a["completed"])
    # each worker saved its devices' final models, identical to the sequential run's
    for d in sequential["client_accuracy"]:
        seq_model = load_file(Path(sequential["run_dir"]) / "models" / f"{d}.safetensors")
        par_model = load_file(Path(parallel["run_dir"]) / "models" / f"{d}.safetensors")
        assert set(par_model) == set(seq_model)
        for k in seq_model:
            np.testing.assert_array_equal(par_model[k], seq_model[k], err_msg=f"{d}/{k}")


def _accept(device_id: str, data: bytes) -> Envelope:
    env = decode(data)
    if env.kind == "error":
        raise WireError(str(env.payload.meta.get("reason")))
    return env


def _evaluate(device_id: str, run: str = "r") -> bytes:
    return encode(
        Envelope(
            "evaluate",
            0,
            device_id,
            algorithm="fedavg",
            payload=Payload({}, {"split": "quick"}),
            run=run,
            nonce="n",
        )
    )


def test_a_worker_that_dies_fails_its_devices_and_the_others_are_served(tmp_path):
    cfg = tiny_config(tmp_path, clients=4, threads=1)
    ids = device_ids(4)
    pool = WorkerPool(cfg, ids, 2)
    procs = list(pool._procs)
    try:
        assert pool.workers == 2 and pool.threads == 1 and set(pool.samples) == set(ids)
        first = pool.request({d: _evaluate(d) for d in ids}, accept=_accept)
        assert all(
            first[d].error is None and 0 <= first[d].value.payload.meta["accuracy"] <= 1
            for d in ids
        )

        # worker 0 holds d00 and d02; kill it
        pool._procs[0].kill()
        pool._procs[0].join()
        second = pool.request({d: _evaluate(d) for d in ids}, accept=_accept)
        for d in ("d00", "d02"):
            assert second[d].reply is None and (
                "exited" in second[d].error or "gone" in second[d].error
            )
        for d in ("d01", "d03"):
            assert second[d].error is None and second[d].value.kind == "metrics"

        # a reply the server refuses is a rejected delivery, not a crash; an unknown device is not
        # connected
        refused = pool.request(
            {"d01": _evaluate("d01"), "d99": _evaluate("d99")},
            accept=lambda d, data: (_ for _ in ()).throw(WireError("refused by the test")),
        )
        assert refused["d01"].rejected == ("refused by the test",) and refused["d01"].reply is None
        assert refused["d99"].error == "device is not connected"
    finally:
        pool.close()
    # the live worker waits for the next pool of this process; the dead one is not taken back
    assert parallel_module.idle_pids() == [procs[1].pid]
    parallel_module.close_idle_workers()
    assert len(procs) == 2 and all(not p.is_alive() for p in procs)


def test_a_pool_takes_the_released_workers_and_without_keep_ends_them(tmp_path):
    parallel_module.close_idle_workers()
    cfg = tiny_config(tmp_path, clients=4, threads=1)
    ids = device_ids(4)
    first = WorkerPool(cfg, ids, 2)
    pids = first.pids
    first.close()
    assert sorted(parallel_module.idle_pids()) == sorted(pids)
    # another run's devices (two of them) on the same processes, served as a fresh pool serves them
    second = WorkerPool(cfg.model_copy(update={"clients": 2}), device_ids(2), 2, keep=False)
    try:
        assert second.pids == pids and parallel_module.idle_pids() == []
        replies = second.request({d: _evaluate(d) for d in device_ids(2)}, accept=_accept)
        assert all(replies[d].value.kind == "metrics" for d in device_ids(2))
        procs = list(second._procs)
    finally:
        second.close()
    assert parallel_module.idle_pids() == [] and all(not p.is_alive() for p in procs)


def test_device_groups_balance_the_work_not_the_count():
    ids = ["a", "b", "c", "d", "e"]
    assert device_groups(ids, 2) == [["a", "c", "e"], ["b", "d"]]  # no costs: round-robin
    # longest first onto the least loaded group (ties: the lower one): b | c, d, a; then e ties at 9
    # | 9
    costs = {"a": 1, "b": 9, "c": 5, "d": 3, "e": 1}
    groups = device_groups(ids, 2, costs)
    assert groups == [["b", "e"], ["a", "c", "d"]]  # each group in ids' order
    assert [sum(costs[d] for d in g) for g in groups] == [10, 9]  # round-robin: 7 | 12
    assert device_groups(ids[:1], 4, costs) == [["a"]]  # never an empty worker


def test_a_worker_that_cannot_build_its_devices_is_a_clear_error(tmp_path):
    cfg = tiny_config(tmp_path, dataset="cifar10", data_dir=str(tmp_path / "missing"))
    with pytest.raises(EdgeflError, match="could not build its devices"):
        WorkerPool(cfg, device_ids(3), 2)
