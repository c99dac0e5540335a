"""``--train-device``: where a device trains (cpu, cuda, cuda:N, auto).

The GPU path itself runs on a machine with one (benchmarks/cuda/results.md: every method on a GPU
against the CPU from the same seed); here, what holds on any machine: the choice is resolved and
refused by name, a CPU run is unchanged by it, and the option reaches the device's settings."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from edgefl.algorithms.training import resolve_compute
from edgefl.data import ArrayDataset
from edgefl.data.sources import dataset_info
from edgefl.errors import ConfigError
from tests.test_exit_codes import env


def edgefl(*args) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "edgefl.cli.main", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env())


def test_auto_picks_cuda_only_when_torch_sees_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_compute("auto") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_compute("auto") == "cuda"
    assert resolve_compute(" CPU ") == "cpu"


def test_cuda_without_a_gpu_is_refused_not_replaced(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"sees no CUDA device .*--train-device cpu"):
        resolve_compute("cuda")
    with pytest.raises(ConfigError, match="cpu, cuda, cuda:N or auto"):
        resolve_compute("gpu0")
    with pytest.raises(ConfigError, match="trains on cpu or cuda"):
        resolve_compute("meta")


def test_a_device_index_beyond_the_gpus_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_compute("cuda:0") == "cuda:0"
    with pytest.raises(ConfigError, match="only 1 CUDA device"):
        resolve_compute("cuda:3")


def test_a_dataset_on_the_cpu_gives_the_same_batches():
    info = dataset_info("synthetic")
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(37, *info.in_shape), dtype=np.uint8)
    y = rng.integers(0, info.num_classes, size=37)
    data = ArrayDataset.from_numpy(x, y, info)
    moved = data.on("cpu")
    assert moved.compute is None and moved.x is data.x  # the same storage, nothing copied
    order = [np.random.default_rng(5), np.random.default_rng(5)]
    for (a, b), (c, d) in zip(
        data.batches(8, shuffle=True, rng=order[0]),
        moved.subset(np.arange(37)).batches(8, shuffle=True, rng=order[1]),
        strict=True,
    ):
        assert torch.equal(a, c) and torch.equal(b, d)
    rows = np.array([3, 1, 30])
    assert torch.equal(moved.labels(rows), data.y[torch.from_numpy(rows)])


def test_the_cli_refuses_cuda_on_a_machine_without_it():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the refusal is for machines without one")
    result = edgefl(
        "simulate", "--dataset", "synthetic", "--clients", "2", "--rounds", "1",
        "--train-device", "cuda",
    )  # fmt: skip
    assert result.returncode != 0
    assert "--train-device cuda: this torch build sees no CUDA device" in result.stderr


def test_train_reads_its_training_device_from_the_file(tmp_path):
    (tmp_path / "device.toml").write_text(
        'broker = "mqtt://broker.lan:1883"\nfleet = "lab"\ndata = "fashion-mnist"\n'
        'train_device = "cpu"\n'
    )
    result = edgefl(
        "train", "--config", tmp_path / "device.toml", "--device-id", "d1", "--print-config"
    )
    assert result.returncode == 0, result.stderr
    assert f'train_device = "cpu"  # file {tmp_path / "device.toml"}' in result.stdout
