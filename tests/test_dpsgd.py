"""DP-SGD on the device (dp=sgd): the ε reported is the accountants' own, the noise is what its
calibration says, a run stops spending at the budget, BatchNorm becomes GroupNorm (and still
exports), and what DP-SGD cannot protect is refused before any training."""

from __future__ import annotations

import logging
import math

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting import pld
from dp_accounting.privacy_accountant import NeighboringRelation
from opacus.accountants import PRVAccountant, RDPAccountant
from torch import nn

from edgefl.data import ArrayDataset, dataset_info
from edgefl.errors import ConfigError
from edgefl.models import ModelSpec, build_model
from edgefl.privacy.dpsgd import SgdPlan, calibrate_sgd, dp_sgd, sgd_epsilon, sgd_plan
from edgefl.privacy.seam import PrivacyBudgetSpent
from edgefl.privacy.trainer import PenalizedLoss
from edgefl.runtime.setup import resolve_method
from tests.conftest import tiny_config
from tests.privacy_cases import budgeted_run

DELTA = 1e-5


# --- accounting: the libraries' own numbers -------------------------------------------------------


@pytest.mark.parametrize(
    "z, q, steps, rounds", [(1.0, 1 / 50, 50, 4), (0.8, 0.01, 100, 3), (2.0, 1 / 13, 13, 5)]
)
def test_epsilon_is_the_librarys_composition_and_agrees_with_opacus(z, q, steps, rounds):
    # Prepare: the same rounds as the library's accountant and Opacus's accountants see them
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), steps * rounds
    )
    library = {}
    for name, relation in (
        ("replace", NeighboringRelation.REPLACE_ONE),
        ("add_remove", NeighboringRelation.ADD_OR_REMOVE_ONE),
    ):
        accountant = pld.PLDAccountant(relation, value_discretization_interval=1e-3)
        accountant.compose(event)
        library[name] = accountant.get_epsilon(DELTA)
    prv, rdp = PRVAccountant(), RDPAccountant()
    prv.history = rdp.history = [(z, q, steps * rounds)]
    # Execute
    ours = sgd_epsilon(z, q, steps, DELTA, rounds)
    ours_add_remove = sgd_epsilon(z, q, steps, DELTA, rounds, relation="add_remove")
    # Assert: our ledger is the library's PLD composition (rounds composed, not steps: same) …
    assert ours == pytest.approx(library["replace"], rel=2e-3)
    assert ours_add_remove == pytest.approx(library["add_remove"], rel=2e-3)
    # … for add-or-remove neighbours it is Opacus's PRV accountant's ε (both tight numerical
    # accountants; PRV's own error bound is about 1 %), and below Opacus's RDP bound (looser) …
    assert ours_add_remove == pytest.approx(prv.get_epsilon(DELTA), rel=0.02)
    assert ours_add_remove < rdp.get_epsilon(DELTA)
    # … and replacing a sample (the dataset size is public) costs more than adding or removing one
    assert ours > ours_add_remove


def test_calibration_spends_the_budget_over_the_planned_rounds_and_no_more():
    # Prepare: Opacus's convention for 500 samples at batch 32: 16 batches, q = 1/16, 16 steps
    # an epoch
    plan = sgd_plan(500, type("S", (), {"batch_size": 32, "steps": None, "epochs": 2})())
    assert (plan.sample_rate, plan.steps) == (1 / 16, 32)
    for target in (1.0, 8.0):
        # Execute
        z = calibrate_sgd(target, DELTA, plan.sample_rate, plan.steps, 5)
        # Assert: within the budget after 5 rounds; 1 % less noise would exceed it
        assert sgd_epsilon(z, plan.sample_rate, plan.steps, DELTA, 5) <= target
        assert sgd_epsilon(z * 0.99, plan.sample_rate, plan.steps, DELTA, 5) > target


# --- the training step: per-sample clipping, calibrated noise, the penalty after the noise --------


def tiny_data(n: int = 64, same: bool = False) -> ArrayDataset:
    info = dataset_info("synthetic")
    x = torch.randint(
        0, 256, (n, *info.in_shape), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
    )
    if same:  # n copies of one image
        x = x[:1].expand(n, *info.in_shape).contiguous()
    return ArrayDataset(x, torch.randint(0, info.num_classes, (n,)), info)


def linear_model(width: int = 200) -> nn.Module:
    torch.manual_seed(0)
    info = dataset_info("synthetic")
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(info.in_shape)), width))


def test_a_step_adds_noise_of_std_z_times_the_clip_over_the_expected_batch():
    # Prepare: a loss with zero gradient, so the step is the noise alone; SGD with lr 1
    data, model = tiny_data(), linear_model()
    before = [p.detach().clone() for p in model.parameters()]
    plan, z, clip = SgdPlan(len(data), 0.25, 1), 1.5, 2.0
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    # Execute
    steps = dp_sgd(model, data, plan, lambda x, y: (model(x) * 0).sum(), optimizer, clip, z)
    # Assert: one step; every coordinate moved by N(0, (z·C / (q·n))²) (≥ 150 000 coordinates:
    # the relative standard error of the std is under 0.2 %, so 1.5 % is over seven of them)
    assert steps == 1
    moved = torch.cat(
        [(p.detach() - b).flatten() for p, b in zip(model.parameters(), before, strict=True)]
    )
    assert len(moved) > 150_000
    assert float(moved.std()) == pytest.approx(z * clip / plan.expected_batch, rel=0.015)
    assert abs(float(moved.mean())) < 5 * z * clip / plan.expected_batch / math.sqrt(len(moved))
    # the hooks are gone: the model is a plain module again
    assert not any(
        hasattr(p, "grad_sample") and p.grad_sample is not None for p in model.parameters()
    )
    assert all(not m._forward_hooks and not m._backward_hooks for m in model.modules())


def test_each_samples_gradient_is_clipped_and_a_weight_penalty_is_added_after_the_noise():
    # Prepare: every sample's gradient is the same huge one (norm ≫ C), the noise negligible; a
    # penalty ½‖w − a‖² of the weights alone, whose gradient is w − a
    data, model = tiny_data(same=True), linear_model(20)
    anchor = [p.detach().clone() + 0.5 for p in model.parameters()]
    before = [p.detach().clone() for p in model.parameters()]
    clip, lr = 0.1, 1.0
    loss = PenalizedLoss(
        lambda x, y: 1e4 * model(x).sum(1).mean(),
        lambda: (
            0.5 * sum(((p - a) ** 2).sum() for p, a in zip(model.parameters(), anchor, strict=True))
        ),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    plan = SgdPlan(len(data), 1.0, 1)  # every sample in the batch: q = 1, expected batch n
    # Execute
    dp_sgd(model, data, plan, loss, optimizer, clip, 1e-9)
    # Assert: the data part of the step is the mean of n gradients clipped to norm C (all the
    # same: norm C); the penalty's gradient w − a = −0.5 is added whole
    # w − lr·(w − a) = w + 0.5·lr
    penalty_step = [lr * 0.5 * torch.ones_like(b) for b in before]
    data_step = torch.cat(
        [
            (p.detach() - b - s).flatten()
            for p, b, s in zip(model.parameters(), before, penalty_step, strict=True)
        ]
    )
    assert float(data_step.norm()) == pytest.approx(clip * lr, rel=1e-3)


# --- a run: ε per device per round, and it stops spending at the budget -------------------------


def test_a_run_with_dp_sgd_reports_epsilon_and_drops_devices_that_spent_their_budget(tmp_path):
    # Prepare: 4 rounds of 3 steps, a noise multiplier whose budget pays for 2 rounds of every
    # device
    from edgefl.runtime.setup import assemble

    z = 1.2
    cfg = tiny_config(
        tmp_path,
        rounds=4,
        options={"dp": "sgd", "dp_target_epsilon": "100", "dp_noise_multiplier": str(z)},
    )
    run = assemble(cfg)
    plans = {d: sgd_plan(len(run.data.parts[i]), run.settings) for i, d in enumerate(run.ids)}
    spent = {
        d: [sgd_epsilon(z, p.sample_rate, p.steps, DELTA, k) for k in (1, 2, 3)]
        for d, p in plans.items()
    }
    target = max(e[1] for e in spent.values()) * 1.0001
    assert target < min(e[2] for e in spent.values())  # 2 rounds fit every device, 3 none
    # Execute
    summary, rounds = budgeted_run(tmp_path, "sgd", z, target)
    # Assert: every device trains in rounds 0 and 1, none after; ε per device per round is the
    # accountant's, on the server's ledger and in the device's report alike
    assert [len(r["selected"]) for r in rounds] == [3, 3, 0, 0]
    assert all(not r["failed"] for r in rounds)
    for k, record in enumerate(rounds[:2]):
        for d in run.ids:
            assert record["privacy"]["epsilon"][d] == pytest.approx(spent[d][k])
            assert record["device_metrics"][d]["dp_epsilon"] == pytest.approx(spent[d][k])
            assert set(record["device_metrics"][d]) == {
                "dp_epsilon"
            }  # nothing else computed on the data
    privacy = summary["privacy"]
    assert (
        privacy["mode"] == "sgd"
        and privacy["sampling"] == "poisson"
        and privacy["unit"] == "sample"
    )
    assert privacy["budget_spent"] == run.ids and max(privacy["epsilon"].values()) <= target
    assert privacy["steps_per_round"] == {d: 3 for d in run.ids}


def test_a_device_refuses_to_train_once_its_budget_is_spent(tmp_path):
    from edgefl.algorithms import DeviceRecord
    from edgefl.runtime.setup import assemble, build_server

    z = 2.0
    cfg = tiny_config(
        tmp_path, options={"dp": "sgd", "dp_target_epsilon": "100", "dp_noise_multiplier": str(z)}
    )
    run = assemble(cfg)
    half = run.device_half("d00")
    one = sgd_epsilon(z, half.plan.sample_rate, half.plan.steps, DELTA, 1)
    cfg = tiny_config(
        tmp_path,
        options={
            "dp": "sgd",
            "dp_target_epsilon": str(one * 1.0001),
            "dp_noise_multiplier": str(z),
        },
    )
    run = assemble(cfg)
    half = run.device_half("d00")
    fleet = {
        d: DeviceRecord(spec=run.specs[d], num_samples=len(run.data.parts[i]))
        for i, d in enumerate(run.ids)
    }
    server = build_server(run.method, run.server_context(fleet))
    half.receive(0, server.downlink(0, "d00"))
    up = half.fit(0)
    assert up.meta == {"num_samples": len(half.ctx.train_data), "dp_epsilon": pytest.approx(one)}
    with pytest.raises(PrivacyBudgetSpent, match="budget spent"):
        half.fit(1)


# --- models: GroupNorm for BatchNorm, said, exported; what Opacus cannot train is refused ---------


def test_group_norm_replaces_every_batch_norm_keeps_the_names_and_exports(tmp_path):
    from edgefl.export.onnx_export import export_model

    info = dataset_info("synthetic")
    spec = ModelSpec(
        "resnet", "10", info.num_classes, info.in_shape, width=0.25, mean=info.mean, std=info.std
    )
    batch = build_model(spec)
    group = build_model(ModelSpec.from_dict({**spec.to_dict(), "options": [["norm", "group"]]}))
    norms = [n for n, m in batch.named_modules() if isinstance(m, nn.BatchNorm2d)]
    assert norms and all(isinstance(group.get_submodule(n), nn.GroupNorm) for n in norms)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in group.modules())
    assert {k for k, _ in group.named_parameters()} == {k for k, _ in batch.named_parameters()}
    assert "norm=group" in group.spec.name
    # DP-SGD trains it (per-sample gradients through GroupNorm and the in-place ReLUs, which it
    # turns off for the round and back on after) …
    data = tiny_data(16)
    before = [p.detach().clone() for p in group.parameters()]
    optimizer = torch.optim.SGD(group.parameters(), lr=0.1)
    loss = lambda x, y: torch.nn.functional.cross_entropy(group(x), y)  # noqa: E731
    assert dp_sgd(group, data, SgdPlan(16, 0.5, 2), loss, optimizer, 1.0, 1.0) == 2
    assert all(not torch.equal(p, b) for p, b in zip(group.parameters(), before, strict=True))
    assert all(m.inplace for m in group.modules() if isinstance(m, nn.ReLU))
    # … and the model exports to ONNX with PyTorch's outputs
    x = data.images(np.arange(14))
    report = export_model(group.eval(), tmp_path / "gn.onnx", parity_images=x)
    assert report.max_abs_diff < 1e-4


def test_dp_sgd_trains_a_batch_norm_model_with_group_norm_and_says_so(tmp_path, caplog):
    from edgefl.runtime.setup import assemble

    caplog.set_level(logging.WARNING, logger="edgefl.models.registry")
    options = {"dp": "sgd", "dp_target_epsilon": "8"}
    run = assemble(
        tiny_config(tmp_path, algorithm="fedavg", model="resnet", tiers=["10"], options=options)
    )
    assert all(dict(s.options)["norm"] == "group" for s in run.specs.values())
    assert "GroupNorm instead (model option norm=group)" in caplog.text
    # a model without BatchNorm is left as it is
    run = assemble(tiny_config(tmp_path, options=options))
    assert all("norm" not in dict(s.options) for s in run.specs.values())
    # asking for BatchNorm under DP-SGD is refused with Opacus's reason, before any training
    run = assemble(
        tiny_config(
            tmp_path, model="resnet", tiers=["10"], model_options={"norm": "batch"}, options=options
        )
    )
    with pytest.raises(
        ConfigError, match="ModuleValidator finds ShouldReplaceModuleError: BatchNorm"
    ):
        run.device_half("d00")


def test_dp_sgd_runs_the_weight_training_methods_and_refuses_the_others_clearly():
    from edgefl.algorithms import algorithm_names

    options = {"dp": "sgd", "dp_target_epsilon": "8"}
    accepted = set()
    for name in algorithm_names():
        try:
            resolve_method(name, options)
            accepted.add(name)
        except ConfigError:
            pass
    assert accepted == {"fedavg", "fedprox", "heterofl", "hierarchyfl", "local"}
    with pytest.raises(ConfigError, match="per-class statistics .* outside DP-SGD"):
        resolve_method("felo", options)
    with pytest.raises(ConfigError, match="not declared fit for DP-SGD"):
        resolve_method("fedhenn", options)


@pytest.mark.slow
def test_dp_sgd_over_mqtt_trains_group_norm_sub_models_and_accounts_as_in_memory(tmp_path):
    # Prepare: HeteroFL (ResNet width tiers with BatchNorm) under DP-SGD on a tiny MQTT fleet
    from edgefl.runtime.fleet import simulate_mqtt

    options = {"dp": "sgd", "dp_target_epsilon": "8", "dp_clip": "1"}
    cfg = tiny_config(
        tmp_path,
        algorithm="heterofl",
        options=options,
        threads=1,
        eval_every=0,
        width=0.125,
        steps=2,
        clients=2,
    )
    # Execute
    summary = simulate_mqtt(cfg.model_copy(update={"run_name": "mqtt"}), deadline=240)
    # Assert: every device spent exactly its calibrated budget over the run's rounds, on the
    # server's ledger, with the plan the device made from its own data
    privacy = summary["privacy"]
    assert privacy["mode"] == "sgd" and privacy["budget_spent"] == ["d00", "d01"]
    for d, spent in privacy["epsilon"].items():
        z, q = privacy["noise_multiplier"][d], privacy["sample_rate"][d]
        assert spent == pytest.approx(sgd_epsilon(z, q, 2, DELTA, 2)) and 7.9 < spent <= 8.0
    assert summary["rounds_completed"] == 2 and not any(summary["failed_per_round"])
