"""A device installed with the [train] layer alone (no [privacy]: no dp-accounting) serves a whole
fleet run, its final model included: nothing on the device path imports the privacy accountant
unless the run protects its uplinks (found by the emulated Pi check: the finish reply imported
it)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.commands import flags

ROOT = Path(__file__).resolve().parents[1]

NO_PRIVACY_LAYER = (
    "import sys\nsys.modules['dp_accounting'] = None  # as if [privacy] were not installed\n"
)


@pytest.mark.slow
def test_a_device_without_the_privacy_layer_returns_its_final_model(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(NO_PRIVACY_LAYER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(ROOT)])}
    env = {k: v for k, v in env.items() if k not in ("EDGEFL_BROKER", "EDGEFL_CONFIG")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgefl.cli.main",
            "simulate",
            *flags(transport="mqtt", algorithm="fedavg", dataset="synthetic", clients=2, rounds=1,
                   train_samples=200, test_samples=100, out=tmp_path / "runs", run_name="r",
                   quiet=True),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "runs" / "r"
    summary = json.loads((run / "summary.json").read_text())
    assert sorted(p.name for p in (run / "models").glob("*.safetensors")) == [
        "d00.safetensors",
        "d01.safetensors",
    ], summary
    logs = "".join(p.read_text() for p in run.rglob("*.log"))
    assert "dp_accounting" not in logs and "dp_accounting" not in result.stderr
