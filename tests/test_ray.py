"""The Ray backend: devices in Ray actors, locally and on a cluster of two nodes, give the
sequential run's results."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import tiny_config
from tests.test_parallel import sequential_and

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray", reason="the dev install brings Ray (pip install -e '.[all,dev]')")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _same_run(a: dict, b: dict, states: list[dict]) -> None:
    assert b["client_accuracy"] == a["client_accuracy"]
    for k in states[0]:
        np.testing.assert_array_equal(states[1][k], states[0][k], err_msg=k)
    for d in a["client_accuracy"]:  # the final models came back from the actors
        assert (Path(b["run_dir"]) / "models" / f"{d}.safetensors").is_file()


def test_ray_actors_give_the_sequential_run(tmp_path):
    cfg = tiny_config(tmp_path, algorithm="fedproto", threads=1, clients=4)
    sequential, on_ray, states = sequential_and(cfg, "ray", backend="ray", workers=2)
    _same_run(sequential, on_ray, states)
    assert not ray.is_initialized()  # the Ray it started for the run is stopped


def test_a_run_joins_a_ray_cluster_of_two_nodes(tmp_path):
    # Prepare: a Ray head and a second node as separate processes, one CPU each, on 127.0.0.1
    exe = shutil.which("ray", path=str(Path(sys.executable).parent))
    assert exe, "the ray command is installed with Ray"
    port = _free_port()
    common = ["--num-cpus", "1", "--node-ip-address", "127.0.0.1", "--disable-usage-stats"]
    address = f"127.0.0.1:{port}"
    try:
        subprocess.run(
            [exe, "start", "--head", "--port", str(port), "--include-dashboard", "false", *common],
            check=True,
            capture_output=True,
            timeout=180,
        )
        subprocess.run(
            [exe, "start", "--address", address, *common],
            check=True,
            capture_output=True,
            timeout=180,
        )
        cfg = tiny_config(tmp_path, algorithm="fedavg", threads=1, clients=4)
        # Execute: two actors of one CPU each: Ray can only place them one per node
        sequential, on_cluster, states = sequential_and(
            cfg, "cluster", backend="ray", workers=2, ray_address=address
        )
        ray.init(address=address, log_to_driver=False, configure_logging=False)
        nodes = [n for n in ray.nodes() if n["Alive"]]
        ray.shutdown()
    finally:
        subprocess.run([exe, "stop", "--force"], capture_output=True, timeout=120)
    # Assert
    assert len(nodes) == 2 and sum(n["Resources"].get("CPU", 0) for n in nodes) == 2
    _same_run(sequential, on_cluster, states)
