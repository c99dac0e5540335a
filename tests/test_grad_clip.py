"""``--max-grad-norm``: each local step's gradient scaled down to an L2 norm before the step."""

import json

import numpy as np
import pytest
import torch
from torch import nn

from edgefl.algorithms import TrainSettings
from edgefl.algorithms.training import train_local
from edgefl.data import ArrayDataset, DatasetInfo
from edgefl.errors import ConfigError
from tests.commands import flags, run_main

INFO = DatasetInfo(
    name="t", num_classes=2, in_shape=(1, 2, 2), mean=(0.0,), std=(1.0,), class_names=("a", "b")
)


def _one_step_change(max_grad_norm: float | None) -> float:
    """The L2 norm of what one SGD step at lr 1 moves a linear model's parameters by."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
    data = ArrayDataset(
        torch.randint(0, 255, (8, 1, 2, 2), dtype=torch.uint8), torch.tensor([0, 1] * 4), INFO
    )
    settings = TrainSettings(steps=1, batch_size=8, lr=1.0, max_grad_norm=max_grad_norm)
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    train_local(model, data, settings, 0, np.random.default_rng(0))
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    return float((after - before).norm())


def test_a_step_moves_the_model_by_at_most_the_lr_times_the_clip():
    # Arrange: the unclipped step's size, to know the clip binds
    free = _one_step_change(None)
    assert free > 0.05
    # Act / Assert: the first momentum-SGD step is lr · the clipped gradient
    assert _one_step_change(0.05) == pytest.approx(0.05, rel=1e-4)
    # a clip above the gradient's norm leaves the step alone
    assert _one_step_change(10 * free) == pytest.approx(free, rel=1e-6)


def test_the_clip_is_refused_under_dp_sgd_which_clips_per_sample():
    from edgefl.privacy.trainer import local_trainer

    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
    data = ArrayDataset(torch.zeros(4, 1, 2, 2, dtype=torch.uint8), torch.tensor([0, 1] * 2), INFO)
    with local_trainer(lambda *a: {}), pytest.raises(ConfigError, match="dp=sgd"):
        train_local(model, data, TrainSettings(max_grad_norm=1.0), 0, np.random.default_rng(0))


def test_the_flag_reaches_the_devices_settings_and_refuses_a_non_positive_norm(
    tmp_path, monkeypatch, capsys
):
    args = ["simulate", *flags(dataset="synthetic", clients=2, rounds=1, train_samples=300,
                               test_samples=100, steps=1, width=0.25, max_grad_norm=2.5,
                               out=tmp_path, run_name="c", json=True, quiet=True)]
    code, _, _ = run_main(args, monkeypatch, capsys)
    assert code == 0
    assert json.loads((tmp_path / "c" / "config.json").read_text())["max_grad_norm"] == 2.5

    code, _, err = run_main(["simulate", "--max-grad-norm", "0", "--quiet"], monkeypatch, capsys)
    assert code != 0 and "max_grad_norm must be > 0" in err
