"""HierarchyFL and HeteroFL: aligned averaging, sub-model slicing, batch-norm statistics, the tier
policy, runs (the server side: tests/test_hierarchyfl_server.py)."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from edgefl.algorithms import (
    DeviceRecord,
)
from edgefl.algorithms.hierarchyfl import (
    DELTAS,
    aligned_average,
    kd_loss,
    slice_aligned_mixture,
)
from edgefl.algorithms.training import recalibrate_batch_norm
from edgefl.data import load_dataset
from edgefl.runtime.simulation import simulate
from tests.conftest import tiny_config
from tests.hierarchy_cases import _one_thread, device, fleet, server, spec  # noqa: F401 (autouse)


def test_aligned_average_against_a_hand_computed_example():
    # Prepare: a 2x3 tensor held whole by one device and by a [1, 2] leading slice by another;
    # a bias held by one device only; a tensor nobody holds.
    g = {
        "w": np.ones((2, 3), np.float32),
        "b": np.zeros(3, np.float32),
        "untouched": np.full(4, 7.0, np.float32),
    }
    whole = {"w": np.full((2, 3), 3.0), "b": np.array([1.0, 2.0, 3.0])}
    part = {"w": np.array([[1.0, 5.0]])}
    # Execute
    uniform, coverage = aligned_average(g, [(whole, 1.0), (part, 1.0)])
    weighted, _ = aligned_average(g, [(whole, 1.0), (part, 3.0)])
    # Assert: held by both -> 1 + mean; held by one -> 1 + its delta; unheld -> unchanged
    np.testing.assert_allclose(uniform["w"], [[1 + 2.0, 1 + 4.0, 1 + 3.0], [4.0, 4.0, 4.0]])
    np.testing.assert_allclose(uniform["b"], [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(uniform["untouched"], g["untouched"])
    assert coverage == pytest.approx(9 / 13)
    np.testing.assert_allclose(weighted["w"][0, :2], [1 + (3 + 3 * 1) / 4, 1 + (3 + 3 * 5) / 4])
    np.testing.assert_allclose(weighted["w"][1], [4.0, 4.0, 4.0])
    assert uniform["w"].dtype == np.float32


def test_width_submodel_slicing_and_write_back_are_exact():
    # Prepare
    srv = server("heterofl", fleet("hierarchy-width", ["1/4", "1"]))
    before = {k: v.clone() for k, v in srv.model.state_dict().items()}
    dev = device(spec("hierarchy-width", "1/4"))
    # Execute: downlink -> device; one round of local training; the delta goes back
    dev.receive(0, srv.downlink(0, "d0"))
    for k, v in dev.model.state_dict().items():
        region = tuple(slice(0, s) for s in v.shape)
        assert v.shape != before[k].shape or k.endswith("bias")  # really a slice for the weights
        torch.testing.assert_close(v, before[k][region], rtol=0, atol=0)
    up = dev.fit(0)
    trained = {k: v.clone() for k, v in dev.model.state_dict().items()}
    metrics = srv.aggregate(0, {"d0": up})
    # Assert: the slice equals the trained sub-model (float rounding only), the rest is untouched
    after = srv.model.state_dict()
    assert metrics["averaged_devices"] == 1 and metrics["coverage"] < 0.2
    for k, v in trained.items():
        region = tuple(slice(0, s) for s in v.shape)
        torch.testing.assert_close(after[k][region], v, rtol=0, atol=1e-5)
        rest = after[k].clone()
        rest[region] = before[k][region]
        torch.testing.assert_close(rest, before[k], rtol=0, atol=0)
    assert any(not torch.equal(after[k], before[k]) for k in trained)


def test_depth_submodel_is_the_global_exit():
    srv = server("heterofl", fleet("hierarchy-depth", ["2", "4"]))
    dev = device(spec("hierarchy-depth", "2"), bn_stats="average")  # the global running statistics
    dev.receive(0, srv.downlink(0, "d0"))
    x = load_dataset("synthetic", "test").images(np.arange(8))
    srv.model.eval()
    dev.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(dev.model(x), srv.model.forward_exits(x)[1][1])
    assert not any(k.startswith(("stages.2", "exits.4")) for k in dev.model.state_dict())


def test_width_hierarchy_outputs_match_the_sliced_submodels():
    srv = server("hierarchyfl", fleet("hierarchy-width", ["1/8", "1/2"]))
    x = load_dataset("synthetic", "test").images(np.arange(16))
    outputs = srv.hierarchy_outputs(x)
    for i, tier in enumerate(("1/8", "1/4", "1/2", "1")):
        dev = device(spec("hierarchy-width", tier))
        srv._downlinks.clear()
        srv.ctx.fleet["probe"] = DeviceRecord(dev.ctx.spec)
        dev.receive(0, srv.downlink(0, "probe"))
        with torch.no_grad():
            s = dev.model.features(x)
            torch.testing.assert_close(outputs[i][0], s)
            torch.testing.assert_close(outputs[i][1], dev.model.classify(s))
    # gradients of a small tier's output land in the leading slice of the global tensors only
    outputs[0][1].sum().backward()
    grad = srv.model.stem.conv.weight.grad
    held = device(spec("hierarchy-width", "1/8")).model.stem.conv.weight.shape[0]
    assert grad[:held].abs().sum() > 0 and grad[held:].abs().sum() == 0


def test_slice_aligned_mixture_and_kd_loss_by_hand():
    f_small, f_big = torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 4.0, 5.0, 6.0]])
    mix = slice_aligned_mixture([f_small, f_big], torch.tensor([0.25, 0.75]))
    torch.testing.assert_close(
        mix, torch.tensor([[0.25 * 1 + 0.75 * 3, 0.25 * 2 + 0.75 * 4, 5.0, 6.0]])
    )
    p = torch.tensor([[0.0, 1.0]])
    assert float(kd_loss(p, p, 3.0)) == pytest.approx(0.0, abs=1e-5)
    q = torch.tensor([[1.0, 0.0]])
    t = torch.softmax(q / 3, 1)
    s = torch.softmax(p / 3, 1)
    assert float(kd_loss(p, q, 3.0)) == pytest.approx(
        float((t * (t / s).log()).sum() * 9), rel=1e-5
    )


def test_refuses_a_foreign_family_and_a_missing_public_set():
    from edgefl.errors import ConfigError

    with pytest.raises(ConfigError, match="hierarchy family"):
        server("heterofl", fleet("resnet", ["18"]))
    with pytest.raises(ConfigError, match="public"):
        server("hierarchyfl", fleet("hierarchy-depth", ["1"]), public_n=0)
    with pytest.raises(ConfigError, match="not a sub-model"):
        server(
            "heterofl",
            {
                **fleet("hierarchy-depth", ["1"]),
                "x": DeviceRecord(replace(spec("hierarchy-depth", "2"), width=0.25)),
            },
        )


def test_width_tier_run_in_memory(tmp_path):
    cfg = tiny_config(
        tmp_path,
        algorithm="hierarchyfl",
        model="hierarchy-width",
        tiers=("1/8", "1/2", "1"),
        rounds=1,
    )
    summary = simulate(cfg)
    assert set(summary["tier_accuracy"]) == {"1/8", "1/2", "1"}
    assert summary["failed_per_round"] == [0]
    import json

    rounds = [
        json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()
    ]
    server_metrics = rounds[0]["server"]
    assert server_metrics["averaged_devices"] == 3 and server_metrics["distill_steps"] >= 1
    assert sum(
        server_metrics[f"meta_weight_{t}"] for t in ("1/8", "1/4", "1/2", "1")
    ) == pytest.approx(1.0, abs=1e-5)


def test_tier_policy_gives_a_smaller_sub_model_for_less_memory():
    from edgefl.profiling import DeviceProfile, TierBudget, choose_tier, estimate_training_memory_mb

    # Prepare: budgets that fit the 1/4 tier but not the 1/2 tier, and every tier
    template = replace(spec("hierarchy-width", "1"), width=1.0)
    tiers = ["1/8", "1/4", "1/2", "1"]
    need = {t: estimate_training_memory_mb(replace(template, tier=t), 32) for t in tiers}
    assert need["1/8"] < need["1/4"] < need["1/2"] < need["1"]

    def profile(ram_mb: float) -> DeviceProfile:
        ram = int(ram_mb)
        return DeviceProfile("dev", "x86_64", "cpu", 4, ram, ram, train_gflops=10.0)

    budget = TierBudget(memory_fraction=0.5)
    # Execute
    small = choose_tier(profile(2 * (need["1/4"] + need["1/2"]) / 2), template, tiers, budget)
    large = choose_tier(profile(2 * need["1"] * 1.1), template, tiers, budget)
    # Assert: less memory, smaller tier; and the server serves exactly that sub-model
    assert (small, large) == ("1/4", "1")
    srv = server("heterofl", {"d0": DeviceRecord(replace(template, tier=small))})
    shapes = {k: v.shape for k, v in srv.downlink(0, "d0").arrays.items()}
    assert shapes["w/stem.conv.weight"] == (16, 1, 3, 3)  # ceil(64 / 4) channels of the stem


def _eval_and_batch_outputs(
    model: torch.nn.Module, x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's outputs on ``x`` with its running statistics (eval) and with x's own (train,
    on a copy: a forward in training mode moves the running statistics)."""
    import copy

    with torch.no_grad():
        evaluated = model.eval()(x)
        batch = copy.deepcopy(model).train()(x)
    return evaluated, batch


def test_recalibrated_running_statistics_are_the_datas_statistics_for_the_current_weights():
    # Prepare: a trained depth sub-model whose running statistics belong to other weights (those
    # averaged into them, here: the initial statistics of a differently seeded twin)
    dev = device(spec("hierarchy-depth", "3"), n=64, bn_stats="average")
    dev.fit(0)
    stale = {k: v.clone() for k, v in dev.model.state_dict().items() if "running" in k}
    torch.manual_seed(3)
    dev.model.load_state_dict(
        {**dev.model.state_dict(), **{k: torch.rand_like(v) + 0.5 for k, v in stale.items()}}
    )
    x = dev.ctx.train_data.images()
    weights = {k: v.clone() for k, v in dev.model.named_parameters()}
    # Execute
    layers = recalibrate_batch_norm(dev.model, dev.ctx.train_data)
    # Assert: every BN layer re-estimated, weights untouched, and the model in eval mode now
    # computes what it computes with the batch's own statistics (64 samples: one batch)
    assert layers == sum(isinstance(m, torch.nn.BatchNorm2d) for m in dev.model.modules())
    for k, v in dev.model.named_parameters():
        torch.testing.assert_close(v, weights[k], rtol=0, atol=0)
    evaluated, batch = _eval_and_batch_outputs(dev.model, x)
    # unbiased vs biased variance
    torch.testing.assert_close(evaluated, batch, rtol=0.02, atol=0.02)
    assert all(
        m.momentum == 0.1 for m in dev.model.modules() if isinstance(m, torch.nn.BatchNorm2d)
    )


def test_a_device_recalibrates_the_received_statistics_by_default_and_keeps_them_on_request():
    # Prepare: a downlink whose running statistics do not describe its weights (the averaged
    # statistics of a global model whose devices moved apart, simplified to the initial ones)
    srv = server("heterofl", fleet("hierarchy-depth", ["1", "2"]))
    trained = device(spec("hierarchy-depth", "2"), "d1", n=64)
    trained.receive(0, srv.downlink(0, "d1"))
    srv.aggregate(0, {"d1": trained.fit(0)})
    payload = srv.downlink(1, "d1")
    recalibrating = device(spec("hierarchy-depth", "2"), "d1", n=64)
    keeping = device(spec("hierarchy-depth", "2"), "d1", n=64, bn_stats="average")
    # Execute
    recalibrating.receive(1, payload)
    keeping.receive(1, payload)
    # Assert: the default device evaluates with its data's statistics for the received weights;
    # "average" keeps the received statistics; both hold the received weights
    x = recalibrating.ctx.train_data.images()
    evaluated, batch = _eval_and_batch_outputs(recalibrating.model, x)
    torch.testing.assert_close(evaluated, batch, rtol=0.02, atol=0.02)
    evaluated_stale, _ = _eval_and_batch_outputs(keeping.model, x)
    assert (evaluated_stale - batch).abs().max() > 10 * (evaluated - batch).abs().max()
    for k, v in keeping.model.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), payload.arrays["w/" + k])
        if "running" not in k and "num_batches" not in k:
            np.testing.assert_array_equal(
                recalibrating.model.state_dict()[k].numpy(), payload.arrays["w/" + k]
            )


def test_the_uploaded_statistics_deltas_are_relative_to_the_received_statistics():
    """Recalibration changes what the device evaluates with, not what the server averages: the
    statistics' deltas are taken from the values received."""
    srv = server("heterofl", fleet("hierarchy-depth", ["1", "2"]))
    payload = srv.downlink(0, "d1")
    dev = device(spec("hierarchy-depth", "2"), "d1", n=64)
    dev.receive(0, payload)
    up = dev.fit(0)
    state = dev.model.state_dict()
    for k in (k for k in state if "running" in k):
        np.testing.assert_allclose(
            up.arrays[DELTAS + k], state[k].numpy() - payload.arrays["w/" + k], rtol=0, atol=1e-6
        )


def test_heterofl_and_hierarchyfl_get_identical_partitions_for_a_seed(tmp_path):
    from edgefl.runtime.setup import assemble
    from tests.conftest import tiny_config

    common = {
        "clients": 4,
        "model": "hierarchy-depth",
        "tiers": ("1", "2", "3", "4"),
        "partition": "dirichlet",
        "alpha": 0.1,
        "public_fraction": 0.05,
        "seed": 3,
    }
    hetero = assemble(tiny_config(tmp_path, algorithm="heterofl", **common))
    hier = assemble(tiny_config(tmp_path, algorithm="hierarchyfl", **common))
    # the same public carve-out, the same device pool and Dirichlet draw, the same tiers
    assert hetero.data.public is not None and len(hetero.data.public) == len(hier.data.public) > 0
    np.testing.assert_array_equal(hetero.data.public.y.numpy(), hier.data.public.y.numpy())
    np.testing.assert_array_equal(hetero.data.pool, hier.data.pool)
    assert len(hetero.data.parts) == len(hier.data.parts) == 4
    for a, b in zip(hetero.data.parts, hier.data.parts, strict=True):
        np.testing.assert_array_equal(a, b)
    assert {d: s.tier for d, s in hetero.specs.items()} == {
        d: s.tier for d, s in hier.specs.items()
    }
    # and the benchmark pairs its cells that way: same configuration but the method and its options
    from benchmarks.hierarchyfl import make

    cells = {(c.method, c.setting, c.seed): c.config for c in make(False).cells}
    for (method, setting, seed), config in cells.items():
        if method == "hierarchyfl":
            other = cells[("heterofl", setting, seed)]
            differ = {k for k in config.keys() | other.keys() if config.get(k) != other.get(k)}
            assert differ == {"algorithm", "options"}, (setting, seed, differ)

