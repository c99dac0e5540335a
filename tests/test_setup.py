"""The one run assembly: a device process builds exactly what the simulated device builds."""

import pytest
import torch

from edgefl.runtime.assignment import Assignment, build_assigned
from edgefl.runtime.dataspec import DataSpec
from edgefl.runtime.setup import assemble, resolve_method
from tests.conftest import tiny_config


def assignment_for(run, device_id):
    """What the MQTT server would assign this device for the same configuration."""
    cfg = run.cfg
    return Assignment(
        spec=run.specs[device_id],
        algorithm=cfg.algorithm,
        options=dict(cfg.options),
        settings=run.settings,
        rounds=cfg.rounds,
        seed=cfg.seed,
        public_fraction=run.method.needs.public_share,
        epoch="e",
    )


@pytest.mark.parametrize(("algorithm", "options"), [
    ("fedavg", {}),
    ("hierarchyfl", {}),  # a server-held labelled share is carved out before partitioning
    ("fedhenn", {"rad_source": "device", "rad_size": "20"}),  # devices hold the alignment pool
])
def test_a_device_process_builds_what_the_simulated_device_builds(tmp_path, algorithm, options):
    # Prepare
    cfg = tiny_config(
        tmp_path, algorithm=algorithm, options=options, partition="dirichlet", alpha=0.5
    )
    run = assemble(cfg)
    for index, device_id in enumerate(run.ids):
        # Execute: the simulation's device and the one a device process builds from --data +
        # assignment
        simulated = run.device_half(device_id)
        text = DataSpec.from_config(cfg, index).to_string()  # what `edgefl train --data` is given
        built, evals = build_assigned(
            DataSpec.parse(text), assignment_for(run, device_id), device_id
        )

        # Assert: same data, same pool, same initial model, same seed
        assert torch.equal(built.ctx.train_data.x, simulated.ctx.train_data.x)
        assert torch.equal(built.ctx.train_data.y, simulated.ctx.train_data.y)
        assert built.ctx.seed == simulated.ctx.seed
        assert built.ctx.spec == simulated.ctx.spec
        if run.method.needs.devices_hold_public:
            assert torch.equal(built.ctx.public.x, run.data.public.x)
        else:
            assert built.ctx.public is None and simulated.ctx.public is None
        a, b = built.model.state_dict(), simulated.model.state_dict()
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert torch.equal(evals["quick"].x, run.data.evals["quick"].x)
    # the shards are disjoint and the server's share is in none of them
    sizes = [len(run.data.parts[i]) for i in range(len(run.ids))]
    public = 0 if run.data.public is None else len(run.data.public)
    assert sum(sizes) + public == len(run.data.train)
    assert (public > 0) == (run.method.needs.public_share > 0)


def test_the_run_setting_overrides_the_declared_public_share():
    assert resolve_method("hierarchyfl", {}).needs.public_share == 0.01
    assert resolve_method("hierarchyfl", {}, public_share=0.05).needs.public_share == 0.05
    from edgefl.errors import ConfigError

    with pytest.raises(ConfigError, match="public_fraction must be > 0"):
        resolve_method("fedhenn", {"rad_source": "device"}, public_share=0.0)


def test_a_device_without_a_shard_cannot_hold_the_pool(tmp_path):
    from edgefl.errors import ConfigError

    cfg = tiny_config(tmp_path, algorithm="fedhenn", options={"rad_source": "device"})
    run = assemble(cfg)
    with pytest.raises(ConfigError, match="public pool on the device"):
        build_assigned(DataSpec("synthetic", train_samples=600), assignment_for(run, "d00"), "d00")


def test_the_local_reference_ignores_how_the_server_combines_updates():
    """Local sends nothing: a server optimizer or asynchronous aggregation neither changes its
    cache key (make demo's committed reference stays valid) nor reaches its run."""
    from edgefl.config import RunConfig
    from edgefl.runtime.reference import reference_key

    base = RunConfig(algorithm="fedavg")
    other = RunConfig(
        algorithm="fedavg", server_opt="fedadam", server_opt_lr=0.1, aggregation="async", buffer=3
    )
    assert reference_key(base) == reference_key(other)
    assert reference_key(base) != reference_key(
        RunConfig(algorithm="fedavg", epochs=base.epochs + 1)
    )


def test_the_committed_demo_references_are_found_under_the_current_settings():
    """A setting added to RunConfig re-keys the cached Local reference unless it is registered
    in ADDED_SETTINGS with its neutral value: every fresh `make demo` would then train Local again
    (train_device did that, unnoticed, until this test)."""
    import json
    from pathlib import Path

    from edgefl.config import ADDED_SETTINGS, RunConfig
    from edgefl.runtime.reference import reference_key

    demo = Path(__file__).resolve().parents[1] / "benchmarks" / "demo"
    files = sorted(demo.glob("local-*.json"))
    assert files, "the demo's Local reference is committed"
    for path in files:
        stored = json.loads(path.read_text())
        cfg = RunConfig(**stored["config"])
        assert reference_key(cfg) == stored["key"] == path.stem.removeprefix("local-")
        # a neutral added setting is left out of the key; another value is keyed
        assert reference_key(cfg.model_copy(update={"train_device": "cuda"})) != stored["key"]
    assert set(ADDED_SETTINGS) <= set(RunConfig.model_fields)


def test_a_package_missing_from_the_device_is_a_config_error_naming_it(tmp_path, monkeypatch):
    """The device process ends on a ConfigError for its assignment (runtime/device.py) instead of
    logging the same ImportError at every retry while the server waits: a Pi whose [train]
    layer lacked cryptography (imported by the run assembly's secure-aggregation layer) did."""
    import sys

    from edgefl.errors import ConfigError

    run = assemble(tiny_config(tmp_path, algorithm="fedavg"))
    monkeypatch.delitem(sys.modules, "edgefl.runtime.setup")
    for name in ["cryptography", *[m for m in sys.modules if m.startswith("cryptography.")]]:
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed
    for name in [m for m in sys.modules if m.startswith("edgefl.privacy.secagg")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ConfigError, match=r"cryptography is not installed here.*\[train\]"):
        build_assigned(DataSpec("synthetic", train_samples=600), assignment_for(run, "d00"), "d00")


def test_a_missing_edgefl_module_is_a_bug_raised_as_it_is_not_a_missing_install(
        tmp_path, monkeypatch):
    import sys

    run = assemble(tiny_config(tmp_path, algorithm="fedavg"))
    monkeypatch.delitem(sys.modules, "edgefl.runtime.setup")
    monkeypatch.setitem(sys.modules, "edgefl.privacy.secagg_halves", None)
    with pytest.raises(ModuleNotFoundError, match="edgefl.privacy.secagg_halves"):
        build_assigned(DataSpec("synthetic", train_samples=600), assignment_for(run, "d00"), "d00")
