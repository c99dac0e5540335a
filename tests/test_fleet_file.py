"""Fleet files (devices/*.yaml) and ``simulate --fleet``: tiers chosen by the tier policy."""

import json
from pathlib import Path

import pytest
import yaml

from edgefl.errors import ConfigError
from edgefl.models import ModelSpec
from edgefl.profiling import DeviceProfile, load_fleet, read_fleet, training_flops_per_sample
from edgefl.runtime.simulation import simulate
from tests.conftest import tiny_config

DEVICES = Path(__file__).resolve().parent.parent / "devices"
REFERENCE = ["raspberry-pi-4", "raspberry-pi-5", "jetson-nano", "jetson-orin-nano", "x86-laptop"]


def _profile(name, gflops, ram=4000):
    return {
        "arch": "aarch64",
        "cpu_model": "test",
        "cores": 4,
        "ram_total_mb": ram,
        "ram_available_mb": ram,
        "train_gflops": gflops,
        "name": name,
    }


def test_reference_fleet_loads_every_profile():
    fleet = load_fleet(DEVICES / "fleet-mixed.yaml")

    ids = [d for d, _ in fleet]
    names = {p.name for _, p in fleet}

    assert len(ids) == len(set(ids)) == 10
    assert ids[:4] == ["pi4-0", "pi4-1", "pi4-2", "pi4-3"] and "laptop" in ids
    assert names == set(REFERENCE)
    assert all(isinstance(p, DeviceProfile) and p.train_gflops > 0 for _, p in fleet)
    assert all(p.source.startswith("reference estimate") for _, p in fleet)


def test_reference_fleet_spreads_full_width_tiers():
    # the budget documented in fleet-mixed.yaml: Pi 4 / Nano 1/4, Pi 5 / Orin 1/2, laptop 1
    from edgefl.profiling import fleet_tiers

    fleet = read_fleet(DEVICES / "fleet-mixed.yaml")
    template = ModelSpec("hierarchy-width", "1/8", 10, (1, 28, 28))

    tiers = fleet_tiers(
        fleet,
        template,
        ["1/8", "1/4", "1/2", "1"],
        batch_size=32,
        samples_per_round=dict.fromkeys(fleet.ids, 500),
    )

    assert tiers["pi4-0"] == tiers["nano-0"] == "1/4"
    assert tiers["pi5-0"] == tiers["orin"] == "1/2"
    assert tiers["laptop"] == "1"


@pytest.mark.parametrize(
    ("devices", "budget", "needle"),
    [
        ([{"id": "a", "profile": "missing-profile"}], {}, "does not exist"),
        (
            [
                {"id": "a", "profile": _profile("x", 1.0), "count": 2},
                {"id": "a-1", "profile": _profile("y", 1.0)},
            ],
            {},
            "duplicate device ids a-1",
        ),
        ([{"id": "a", "profile": _profile("x", 1.0), "count": 0}], {}, "positive integer"),
        ([{"id": "a", "profile": _profile("x", 1.0)}], {"speed": 3}, "unknown budget keys speed"),
        ([{"id": "a", "profile": _profile("x", 1.0)}], {"memory_fraction": 2}, "memory_fraction"),
        ([{"profile": _profile("x", 1.0)}], {}, "needs 'id' and 'profile'"),
    ],
)
def test_bad_fleet_files_are_refused(tmp_path, devices, budget, needle):
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({"budget": budget, "devices": devices}))

    with pytest.raises(ConfigError, match=needle):
        read_fleet(path)


def _two_speed_fleet(tmp_path):
    """A slow device that fits only the smallest CNN tier in 10 s, and a fast one that fits all."""
    samples = 100
    spec1 = ModelSpec("cnn", "1", 10, (1, 28, 28), width=0.25, mean=(0.5,), std=(0.292,))
    slow_gflops = 1.5 * samples * training_flops_per_sample(spec1) / 10.0 / 1e9  # tier 1: 6.7 s
    path = tmp_path / "fleet.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "budget": {"round_seconds": 10.0, "samples_per_round": samples},
                "devices": [
                    {"id": "slow", "profile": _profile("slow-board", slow_gflops), "count": 2},
                    {"id": "fast", "profile": _profile("fast-board", 1000.0)},
                ],
            }
        )
    )
    return path


def test_simulate_with_fleet_assigns_tiers_by_profile(tmp_path):
    fleet = _two_speed_fleet(tmp_path)
    cfg = tiny_config(
        tmp_path, algorithm="local", model="cnn", tiers=None, clients=3, fleet_file=str(fleet)
    )

    summary = simulate(cfg)

    config = json.loads((Path(summary["run_dir"]) / "config.json").read_text())
    tiers = {d: v["spec"]["tier"] for d, v in config["fleet"].items()}
    assert tiers == {"slow-0": "1", "slow-1": "1", "fast": "5"}
    assert config["profiles"] == {
        "slow-0": "slow-board",
        "slow-1": "slow-board",
        "fast": "fast-board",
    }
    assert set(summary["client_accuracy"]) == {"slow-0", "slow-1", "fast"}


@pytest.mark.slow
def test_the_same_fleet_file_gives_the_same_devices_and_tiers_in_memory_and_over_mqtt(tmp_path):
    # Prepare: a fleet file whose tier policy gives its devices different tiers
    from edgefl.runtime.fleet import simulate_mqtt

    fleet = _two_speed_fleet(tmp_path)
    cfg = tiny_config(
        tmp_path,
        algorithm="local",
        model="cnn",
        tiers=None,
        clients=3,
        fleet_file=str(fleet),
        rounds=1,
        threads=1,
    )
    # Execute: the in-memory run, then the same configuration over MQTT (one process per device)
    memory = simulate(cfg.model_copy(update={"run_name": "memory"}), plots=False)
    mqtt = simulate_mqtt(cfg.model_copy(update={"run_name": "mqtt"}), deadline=240)

    # Assert: the same device ids, in the same order, with the same tiers, and each device
    # registered with its profile from the fleet file
    def fleet_of(summary):
        config = json.loads((Path(summary["run_dir"]) / "config.json").read_text())
        return config["fleet"]

    in_memory, over_mqtt = fleet_of(memory), fleet_of(mqtt)
    tiers = {d: v["spec"]["tier"] for d, v in in_memory.items()}
    assert tiers == {"slow-0": "1", "slow-1": "1", "fast": "5"}
    assert {d: v["spec"]["tier"] for d, v in over_mqtt.items()} == tiers
    assert sorted(mqtt["client_accuracy"]) == sorted(memory["client_accuracy"]) == sorted(tiers)
    assert {d: v["profile"]["name"] for d, v in over_mqtt.items()} == {
        "slow-0": "slow-board", "slow-1": "slow-board", "fast": "fast-board"}
    assert {d: v["num_samples"] for d, v in over_mqtt.items()} == {
        d: v["num_samples"] for d, v in in_memory.items()
    }


def test_simulate_refuses_fleet_of_other_size(tmp_path):
    cfg = tiny_config(
        tmp_path, algorithm="local", clients=4, fleet_file=str(_two_speed_fleet(tmp_path))
    )

    with pytest.raises(ConfigError, match="has 3 devices, but clients=4"):
        simulate(cfg)


def test_cli_fleet_option_takes_the_device_count_from_the_file(tmp_path):
    from typer.testing import CliRunner

    from edgefl.cli.main import app

    fleet = _two_speed_fleet(tmp_path)
    args = [
        "simulate", "--algorithm", "local", "--dataset", "synthetic", "--model", "cnn",
        "--fleet-file", str(fleet), "--rounds", "1", "--steps", "2", "--batch-size", "16",
        "--width", "0.25", "--train-samples", "300", "--test-samples", "100",
        "--out", str(tmp_path), "--run-name", "cli", "--json", "--quiet",
    ]  # fmt: skip

    result = CliRunner().invoke(app, args)

    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["tier_devices"] == {"1": 2, "5": 1}
