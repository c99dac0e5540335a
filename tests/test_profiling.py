import json
import logging
from dataclasses import replace

import pytest
import torch
from torch import nn

from edgefl.errors import ConfigError
from edgefl.models import ModelSpec, family_tiers
from edgefl.profiling import (
    DeviceProfile,
    TierBudget,
    choose_tier,
    cpu_model,
    detect_kind,
    estimate_round_seconds,
    estimate_tiers,
    estimate_training_memory_mb,
    jetson_release,
    memory_mb,
    model_cost,
    profile_device,
    read_board,
    trace_module,
)

WIDTH_TIERS = family_tiers("hierarchy-width")  # 1/8, 1/4, 1/2, 1
TEMPLATE = ModelSpec(
    "hierarchy-width", WIDTH_TIERS[0], num_classes=10, in_shape=(3, 32, 32), width=0.25
)


def make_profile(ram_available_mb=2000, train_gflops=5.0, **kw):
    return DeviceProfile(
        name="test-device",
        arch="aarch64",
        cpu_model="Cortex-A72",
        cores=4,
        ram_total_mb=max(4000, ram_available_mb),
        ram_available_mb=ram_available_mb,
        train_gflops=train_gflops,
        **kw,
    )


def fake_root(tmp_path, model=None, tegra=None, cpuinfo=None, meminfo=None):
    if model is not None:
        (tmp_path / "proc/device-tree").mkdir(parents=True)
        (tmp_path / "proc/device-tree/model").write_bytes(model.encode() + b"\x00")
    if tegra is not None:
        (tmp_path / "etc").mkdir(parents=True)
        (tmp_path / "etc/nv_tegra_release").write_text(tegra)
    if cpuinfo is not None:
        (tmp_path / "proc").mkdir(parents=True, exist_ok=True)
        (tmp_path / "proc/cpuinfo").write_text(cpuinfo)
    if meminfo is not None:
        (tmp_path / "proc").mkdir(parents=True, exist_ok=True)
        (tmp_path / "proc/meminfo").write_text(meminfo)
    return tmp_path


# --- detection ------------------------------------------------------------------------------


def test_raspberry_pi_detected_from_device_tree(tmp_path):
    root = fake_root(
        tmp_path,
        model="Raspberry Pi 4 Model B Rev 1.4",
        cpuinfo="processor\t: 0\nBogoMIPS\t: 108.00\n\nHardware\t: BCM2835\nModel\t: Raspberry Pi "
        "4 Model B Rev 1.4\n",
        meminfo="MemTotal:        3884096 kB\nMemFree:          100000 kB\nMemAvailable:    "
        "3072000 kB\n",
    )

    kind, board = detect_kind(root, cuda=False)

    assert (kind, board) == ("raspberry-pi", "Raspberry Pi 4 Model B Rev 1.4")  # NUL stripped
    assert cpu_model(root) == "BCM2835"
    assert memory_mb(root) == (3884096 // 1024, 3000)
    assert jetson_release(root) is None


def test_jetson_detected_from_release_file(tmp_path):
    root = fake_root(
        tmp_path,
        tegra="# R32 (release), REVISION: 7.1, GCID: 29818004, BOARD: t210ref, EABI: aarch64\n",
    )

    kind, board = detect_kind(root, cuda=False)

    assert kind == "jetson" and board is None
    assert jetson_release(root) == "R32 (release), REVISION: 7.1"


def test_jetson_detected_from_device_tree_even_with_cuda(tmp_path):
    root = fake_root(tmp_path, model="NVIDIA Jetson Orin Nano Developer Kit")

    assert detect_kind(root, cuda=True) == ("jetson", "NVIDIA Jetson Orin Nano Developer Kit")


def test_plain_machine_is_cpu_or_cuda_host(tmp_path):
    root = fake_root(tmp_path, cpuinfo="processor\t: 0\nmodel name\t: AMD EPYC 7B13\n")

    assert detect_kind(root, cuda=False) == ("cpu", None)
    assert detect_kind(root, cuda=True) == ("cuda-host", None)
    assert read_board(root) is None
    assert cpu_model(root) == "AMD EPYC 7B13"


# --- the profile ----------------------------------------------------------------------------


def test_profile_device_measures_and_round_trips_json():
    profile = profile_device(quick=True, name="here")

    again = DeviceProfile.from_dict(json.loads(json.dumps(profile.to_dict())))

    assert again == profile
    assert profile.name == "here" and profile.cores >= 1
    assert 0 < profile.ram_available_mb <= profile.ram_total_mb
    assert profile.train_gflops > 0 and profile.train_images_per_s > 0 and profile.matmul_gflops > 0
    assert profile.torch == torch.__version__


def test_profile_rejects_unknown_fields_and_bad_values():
    data = make_profile().to_dict()

    with pytest.raises(ConfigError, match="unknown device profile fields: colour"):
        DeviceProfile.from_dict({**data, "colour": "red"})
    with pytest.raises(ConfigError, match="exceeds"):
        DeviceProfile.from_dict({**data, "ram_available_mb": data["ram_total_mb"] + 1})
    with pytest.raises(ConfigError, match="train_gflops"):
        DeviceProfile.from_dict({**data, "train_gflops": float("nan")})


# --- the cost model -------------------------------------------------------------------------


def test_trace_counts_conv_and_linear_macs_exactly():
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 4 * 4, 5)
    )

    cost = trace_module(model, (3, 4, 4))

    assert cost.macs == 8 * 4 * 4 * 3 * 9 + 5 * 128
    assert cost.parameters == 8 * 3 * 9 + 8 + 128 * 5 + 5


def test_saved_activations_grow_with_hidden_width():
    def mlp(hidden):
        return nn.Sequential(nn.Linear(16, hidden), nn.ReLU(), nn.Linear(hidden, 4))

    small, large = trace_module(mlp(64), (16,)), trace_module(mlp(640), (16,))

    # the ReLU output (saved by ReLU and by the last Linear, counted once) scales with hidden
    assert large.activation_bytes - small.activation_bytes == pytest.approx(
        (640 - 64) * 4, rel=0.01
    )


def test_estimates_grow_with_tier():
    specs = [replace(TEMPLATE, tier=t) for t in WIDTH_TIERS]
    profile = make_profile()

    memory = [estimate_training_memory_mb(s, 32) for s in specs]
    seconds = [estimate_round_seconds(s, profile, 640) for s in specs]

    assert all(a < b for a, b in zip(memory, memory[1:], strict=False))
    assert all(a < b for a, b in zip(seconds, seconds[1:], strict=False))
    # round time is linear in samples and inversely proportional to throughput
    assert estimate_round_seconds(specs[1], make_profile(train_gflops=10.0), 1280) == pytest.approx(
        seconds[1]
    )


def test_memory_estimate_follows_the_formula():
    spec = replace(TEMPLATE, tier="1/2")
    c = model_cost(spec)

    sgd, adam = (
        estimate_training_memory_mb(spec, 8, "sgd"),
        estimate_training_memory_mb(spec, 8, "adam"),
    )
    b16 = estimate_training_memory_mb(spec, 16, "sgd")

    assert (adam - sgd) * 2**20 == pytest.approx(2 * 4 * c.parameters)
    per_sample = c.activation_bytes + c.input_bytes + 4 * c.num_classes + c.largest_activation_bytes
    assert (b16 - sgd) * 2**20 == pytest.approx(8 * per_sample)
    with pytest.raises(ConfigError, match="unknown optimizer"):
        estimate_training_memory_mb(spec, 8, "lamb")


# --- the tier policy ------------------------------------------------------------------------


def _memory_of(tier, budget):
    return estimate_training_memory_mb(replace(TEMPLATE, tier=tier), budget.batch_size)


def test_smaller_memory_budget_gives_smaller_or_equal_tier():
    budget = TierBudget(memory_fraction=0.5)
    need = {t: _memory_of(t, budget) for t in WIDTH_TIERS}
    # RAM such that the largest tier just fits, then shrink it step by step
    rams = [int(2 * need[WIDTH_TIERS[-1]]) + 2, int(2 * need["1/4"]) + 2, int(2 * need["1/8"]) + 2]

    chosen = [
        choose_tier(make_profile(ram_available_mb=r), TEMPLATE, WIDTH_TIERS, budget) for r in rams
    ]

    assert chosen == [WIDTH_TIERS[-1], "1/4", "1/8"]
    idx = [WIDTH_TIERS.index(t) for t in chosen]
    assert idx == sorted(idx, reverse=True)


def test_clear_memory_gap_gives_strictly_smaller_tier():
    big, small = make_profile(ram_available_mb=8000), make_profile(ram_available_mb=40)
    budget = TierBudget(memory_fraction=0.5)

    large_tier = choose_tier(big, TEMPLATE, WIDTH_TIERS, budget)
    small_tier = choose_tier(small, TEMPLATE, WIDTH_TIERS, budget)

    assert WIDTH_TIERS.index(small_tier) < WIDTH_TIERS.index(large_tier) == len(WIDTH_TIERS) - 1


def test_round_time_limit_picks_a_smaller_tier_on_a_slower_device():
    budget = TierBudget(round_seconds=10.0, samples_per_round=640)
    estimates = estimate_tiers(make_profile(train_gflops=1.0), TEMPLATE, WIDTH_TIERS, budget)
    # a device 10x faster fits tiers whose time on the slow one is up to 100 s
    fast_expected = [e.tier for e in estimates if e.round_seconds <= 100.0][-1]
    slow_expected = [e.tier for e in estimates if e.round_seconds <= 10.0][-1]

    slow = choose_tier(make_profile(train_gflops=1.0), TEMPLATE, WIDTH_TIERS, budget)
    fast = choose_tier(make_profile(train_gflops=10.0), TEMPLATE, WIDTH_TIERS, budget)

    assert (slow, fast) == (slow_expected, fast_expected)
    assert WIDTH_TIERS.index(slow) < WIDTH_TIERS.index(fast)


def test_nothing_fits_gives_smallest_with_warning_or_raises_when_strict(caplog):
    tiny = make_profile(ram_available_mb=1)
    caplog.set_level(logging.WARNING, logger="edgefl.profiling")

    tier = choose_tier(tiny, TEMPLATE, WIDTH_TIERS)

    assert tier == WIDTH_TIERS[0]
    assert "no tier of hierarchy-width fits device 'test-device'" in caplog.text
    with pytest.raises(ConfigError, match="no tier"):
        choose_tier(tiny, TEMPLATE, WIDTH_TIERS, strict=True)


def test_budget_validation():
    with pytest.raises(ConfigError):
        TierBudget(memory_fraction=0)
    with pytest.raises(ConfigError):
        TierBudget(round_seconds=-1)
    with pytest.raises(ConfigError):
        TierBudget(optimizer="lamb")


def test_cli_device_profile_json():
    from typer.testing import CliRunner

    from edgefl.cli.main import app

    result = CliRunner().invoke(
        app, ["device", "profile", "--json", "--quick", "--name", "cli-test"]
    )

    assert result.exit_code == 0, result.output
    profile = DeviceProfile.from_dict(json.loads(result.stdout.strip().splitlines()[-1]))
    assert (
        profile.name == "cli-test"
        and profile.source == "measured (quick)"
        and profile.train_gflops > 0
    )
