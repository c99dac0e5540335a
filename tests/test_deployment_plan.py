"""``edgefl deploy``'s choice of devices and files (edgefl/export/deployment.py), without a
broker."""

import json
from pathlib import Path

import pytest

from edgefl.errors import ConfigError, ModelFileError
from edgefl.export.deployment import Target, plan


@pytest.fixture
def run(tmp_path) -> Path:
    """A run of three devices: a CPU-only ARM board, an x86 box, and an ARM board with an
    accelerator; d02 sent no final model (nothing exported)."""
    run = tmp_path / "run-a"
    fleet = {"d00": {"spec": {"tier": "1"}, "profile": {"arch": "aarch64"}},
             "d01": {"spec": {"tier": "2"}, "profile": {"arch": "x86_64"}},
             "d02": {"spec": {"tier": "1"}, "profile": {"arch": "aarch64", "accelerator": "cuda"}}}
    (run / "onnx").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"fleet": fleet}))
    for name in ("d00.onnx", "d00.int8.onnx", "d01.onnx", "d01.int8.onnx"):
        (run / "onnx" / name).write_bytes(b"onnx")
    return run


def test_every_exported_device_of_the_run_gets_its_file(run):
    said = []
    targets = plan(run=run, say=said.append)
    # CPU-only ARM: int8
    assert targets == [Target("d00", "1", run / "onnx" / "d00.int8.onnx", "int8"),
                       Target("d01", "2", run / "onnx" / "d01.onnx", "fp32")]
    assert said == [
        f"skipping d02: no exported model in {run / 'onnx'} (edgefl export skipped it: no final "
        "model)"
    ]
    assert [t.fmt for t in plan(run=run, fmt="fp32", say=said.append)] == ["fp32", "fp32"]


def test_devices_by_tier_or_name_and_rollbacks(run, tmp_path):
    with pytest.raises(ConfigError, match="no exported model .*d02.onnx"):  # named: not skipped
        plan(run=run, tier="1")
    assert plan(run=run, tier="2") == [Target("d01", "2", run / "onnx" / "d01.onnx", "fp32")]
    assert plan(run=run, devices=["d02"], rollback=True) == [Target("d02", "1")]
    model = tmp_path / "m.int8.onnx"
    model.write_bytes(b"onnx")
    assert plan(model=model, devices=["pi-7"]) == [Target("pi-7", "", model, "int8")]


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"fmt": "fp16"}, "--format 'fp16': choose fp32, int8 or auto"),
    ({}, "name the devices"),
    ({"tier": "1"}, "--tier needs --run"),
    ({"devices": ["pi-7"]}, "give --run RUN (its exported models) or --model FILE --device ID"),
    ({"devices": ["pi-7"], "model": Path("nowhere.onnx")}, "no model file nowhere.onnx"),
])
def test_mistakes_are_named(kwargs, says):
    with pytest.raises(ConfigError) as e:
        plan(**kwargs)
    assert says in str(e.value)


def test_a_tier_the_run_lacks_and_a_folder_that_is_no_run(run, tmp_path):
    with pytest.raises(ConfigError, match="the run has no device of tier '9'; tiers: 1, 2"):
        plan(run=run, tier="9")
    with pytest.raises(ModelFileError, match="is not a run directory"):
        plan(run=tmp_path)
