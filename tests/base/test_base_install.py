"""The base install: no torch at import, the device commands work without the optional layers,
and a command that needs a missing layer names it and exits with its own code."""

import json
import socket
import subprocess
import sys

from tests.base.helpers import MODEL, ROOT, env, run_edgefl, train_args

HEAVY = ("torch", "torchvision", "onnx", "amqtt", "matplotlib", "cryptography", "aiohttp", "PIL")


def _imported_after(statement: str) -> list[str]:
    code = (
        f"{statement}; import sys, json; print(json.dumps(sorted(m for m in {HEAVY!r} if m in "
        "sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env(),
        cwd=ROOT,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_the_cli_imports_no_optional_layer():
    assert _imported_after("import edgefl.cli.main") == []


def test_the_device_side_modules_import_no_optional_layer():
    statement = (
        "import edgefl.inference, edgefl.profiling, edgefl.runtime.device, edgefl.data, "
        "edgefl.models, "
        "edgefl.transport.mqtt, edgefl.wire, edgefl.cli.train, edgefl.cli.infer, edgefl.cli.device"
    )
    assert _imported_after(statement) == []


def test_help_works_without_the_optional_layers():
    result = run_edgefl("--help")
    assert result.returncode == 0 and "train" in result.stdout and "infer" in result.stdout


def test_device_profile_without_torch_detects_the_device_and_measures_matmul():
    result = run_edgefl("device", "profile", "--json", "--quick")
    assert result.returncode == 0, result.stderr
    profile = json.loads(result.stdout)
    assert profile["torch"] == "" and profile["matmul_gflops"] > 0 and profile["cores"] >= 1
    assert profile["train_gflops"] == 0 and "no torch" in profile["source"]


def test_train_without_torch_names_the_extra_to_install_and_exits_7():
    # a listening socket is enough for the broker check; the torch import comes right after it
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        result = run_edgefl(*train_args(f"mqtt://127.0.0.1:{port}", 5))
    assert result.returncode == 7, result.stderr
    assert (
        "[train] install layer: pip install './edgefl_toolkit-" in result.stderr
        and "whl[train]'" in result.stderr
        and "Traceback" not in result.stderr
    )


def test_simulate_without_the_server_layer_names_an_extra():
    result = run_edgefl("simulate", "--dataset", "synthetic", "--rounds", "1", "--quiet")
    assert result.returncode == 7, result.stderr
    assert (
        "install layer: pip install './edgefl_toolkit-" in result.stderr
        and "Traceback" not in result.stderr
    )


def test_infer_on_a_builtin_dataset_needs_no_pillow():
    result = run_edgefl(
        "infer", str(MODEL), "--dataset", "synthetic", "--limit", "50", "--json", block_images=True
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["samples"] == 50


def test_decoding_image_files_without_pillow_names_the_images_extra_and_exits_7(tmp_path):
    # PIL is imported before the first file is decoded: the bytes need not be a real PNG
    for name in ("a", "b"):
        (tmp_path / "pics" / name).mkdir(parents=True)
        (tmp_path / "pics" / name / "0.png").write_bytes(b"not decoded")
    for args in (
        ("--dataset", f"imagefolder:{tmp_path / 'pics'}"),
        (str(tmp_path / "pics" / "a" / "0.png"),),
    ):
        result = run_edgefl("infer", str(MODEL), *args, block_images=True)
        assert result.returncode == 7, (args, result.stderr)
        assert "whl[images]'" in result.stderr and "Traceback" not in result.stderr
