"""Inference with ONNX Runtime and the export/infer commands as a user meets them."""

import json

import numpy as np
import pytest
import torch

from edgefl.cli.main import main
from edgefl.data import load_dataset
from edgefl.export.errors import InferenceError, ModelFileError
from edgefl.export.onnx_export import export_model
from edgefl.inference import Predictor
from edgefl.models import ModelSpec, build_model
from tests.commands import run_main

SYNTH = load_dataset("synthetic", "test")
SPEC = ModelSpec("cnn", "2", 10, (1, 28, 28), width=0.25, mean=SYNTH.info.mean, std=SYNTH.info.std)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(0)
    model = build_model(SPEC).eval()
    path = tmp_path_factory.mktemp("onnx") / "cnn.onnx"
    export_model(model, path, class_names=SYNTH.info.class_names)
    return model, path


_run = run_main


def _cli_ok(args, monkeypatch, capsys):
    """Run a command that must succeed (typer returns without SystemExit on success)."""
    monkeypatch.setattr("sys.argv", ["edgefl", *args])
    try:
        main()
    except SystemExit as exc:
        assert exc.code in (0, None), capsys.readouterr().err
    return capsys.readouterr().out


def _simulate(out, run_name, *flags, monkeypatch, capsys):
    """A one-round run of two devices (unless ``flags`` say otherwise) on a little synthetic
    data, written to ``out/run_name``; returns the summary (JSON)."""
    tiny = ["--dataset", "synthetic", "--width", "0.25", "--clients", "2", "--rounds", "1",
            "--steps", "3", "--train-samples", "300", "--test-samples", "100"]
    return _cli_ok(["simulate", *tiny, *flags, "--out", str(out), "--run-name", run_name,
                    "--quiet", "--json"], monkeypatch, capsys)


def test_wrong_input_shape_is_a_clear_error(exported):
    _, path = exported
    predictor = Predictor(path)

    with pytest.raises(
        InferenceError,
        match=r"\[2, 3, 32, 32\] does not fit the model, which takes \[N, 1, 28, 28\]",
    ):
        predictor.predict(np.zeros((2, 3, 32, 32), np.float32))
    with pytest.raises(InferenceError, match="uint8 pixels or floats"):
        predictor.predict(np.zeros((2, 1, 28, 28), np.int32))
    # one image, no batch dim
    assert predictor.predict(np.zeros((1, 28, 28), np.float32)).shape == (1,)


@pytest.mark.parametrize(
    "content",
    [b"", b"this is not an onnx model", bytes(range(256)) * 8, "truncated"],
    ids=["empty", "text", "binary", "truncated"],
)
def test_a_corrupted_file_is_rejected(exported, tmp_path, content):
    _, path = exported
    if content == "truncated":
        content = path.read_bytes()[: path.stat().st_size // 2]
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(content)

    with pytest.raises(ModelFileError, match="not a valid ONNX model"):
        Predictor(bad)


def test_cli_errors_are_one_line(exported, tmp_path, monkeypatch, capsys):
    _, path = exported
    np.save(tmp_path / "wrong.npy", np.zeros((2, 3, 32, 32), np.float32))
    (tmp_path / "bad.onnx").write_bytes(b"garbage")

    code, _, err = _run(["infer", str(path), str(tmp_path / "wrong.npy")], monkeypatch, capsys)
    # bad input: ExitCode.CONFIG
    assert code == 3 and "does not fit the model" in err and "Traceback" not in err
    code, _, err = _run(
        ["infer", str(tmp_path / "bad.onnx"), "--dataset", "synthetic"], monkeypatch, capsys
    )
    # an unreadable model file
    assert code == 3 and "not a valid ONNX model" in err and "Traceback" not in err
    code, _, err = _run(["infer", str(path)], monkeypatch, capsys)
    assert code == 3 and "image files or --dataset" in err  # ExitCode.CONFIG


def test_infer_images_prints_the_classes_pytorch_predicts(exported, tmp_path, monkeypatch, capsys):
    from PIL import Image

    model, path = exported
    pixels = SYNTH.x[:3].numpy()
    for i in range(3):
        Image.fromarray(pixels[i, 0]).save(tmp_path / f"img{i}.png")
    np.save(tmp_path / "batch.npy", pixels)  # uint8 [3, 1, 28, 28]
    files = [str(tmp_path / f"img{i}.png") for i in range(3)] + [str(tmp_path / "batch.npy")]

    out = _cli_ok(["infer", str(path), *files, "--json"], monkeypatch, capsys)

    rows = json.loads(out)["predictions"]
    with torch.no_grad():
        expected = model(SYNTH.images(np.arange(3))).argmax(1).tolist()
    assert [r["class"] for r in rows] == expected * 2
    assert (
        rows[0]["name"] == SYNTH.info.class_names[expected[0]] and 0 < rows[0]["probability"] <= 1
    )


def test_a_picture_of_another_size_needs_resize(exported, tmp_path):
    from PIL import Image

    _, path = exported
    Image.fromarray(np.full((40, 40), 128, np.uint8)).save(tmp_path / "big.png")
    predictor = Predictor(path)

    with pytest.raises(InferenceError, match="40×40 pixels, but the model takes 28×28"):
        predictor.load_images([tmp_path / "big.png"])
    assert predictor.load_images([tmp_path / "big.png"], resize=True).shape == (1, 1, 28, 28)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_an_onnx_file_without_edgefl_metadata_still_runs(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(28 * 28, 4)).eval()
    torch.onnx.export(
        model,
        (torch.zeros(1, 1, 28, 28),),
        str(tmp_path / "plain.onnx"),
        dynamo=False,
        input_names=["x"],
        dynamic_axes={"x": {0: "n"}},
    )

    predictor = Predictor(tmp_path / "plain.onnx")

    assert predictor.input_shape == (1, 28, 28) and predictor.class_names == ["0", "1", "2", "3"]
    x = SYNTH.images(np.arange(5))
    with torch.no_grad():
        np.testing.assert_allclose(predictor.logits(x), model(x).numpy(), atol=1e-5)


def test_export_a_run_then_infer_its_accuracy(tmp_path, monkeypatch, capsys):
    # Prepare: a tiny run whose devices hold static-BN hierarchy-width models (the hard case)
    _simulate(tmp_path, "r", "-a", "local", "--model", "hierarchy-width", "--tiers", "1/8,1/4",
              monkeypatch=monkeypatch, capsys=capsys)
    # Execute: export one tier with int8, then run the file on the dataset
    out = _cli_ok(
        [
            "export",
            "--run",
            str(tmp_path / "r"),
            "--tier",
            "1/4",
            "--out",
            str(tmp_path / "m.onnx"),
            "--quantize",
            "int8",
            "--calibration-samples",
            "64",
            "--json",
        ],
        monkeypatch,
        capsys,
    )
    (report,) = json.loads(out)
    infer = json.loads(
        _cli_ok(
            ["infer", str(tmp_path / "m.onnx"), "--dataset", "synthetic", "--json"],
            monkeypatch,
            capsys,
        )
    )
    infer8 = json.loads(
        _cli_ok(
            ["infer", str(tmp_path / "m.int8.onnx"), "--dataset", "synthetic", "--json"],
            monkeypatch,
            capsys,
        )
    )
    # Assert
    assert report["device_id"] == "d01" and report["spec"]["tier"] == "1/4"
    assert report["batch_norm"] == "frozen from 64 calibration images"
    assert report["accuracy"] == infer["accuracy"] and infer["samples"] == len(SYNTH)
    assert report["int8"]["accuracy"] == infer8["accuracy"] and "int8" in infer8["quantization"]
    assert report["int8"]["size_bytes"] < report["size_bytes"]

    code, _, err = _run(
        [
            "export",
            "--run",
            str(tmp_path / "r"),
            "--device",
            "d07",
            "--out",
            str(tmp_path / "x.onnx"),
        ],
        monkeypatch,
        capsys,
    )
    assert code == 3 and "no device 'd07'" in err  # ExitCode.CONFIG
    code, _, err = _run(
        ["export", "--run", str(tmp_path / "r"), "--all", "--out", str(tmp_path / "x.onnx")],
        monkeypatch,
        capsys,
    )
    assert code == 3 and "must be a directory" in err


def test_a_run_exports_on_a_machine_without_its_dataset(tmp_path, monkeypatch, capsys):
    """A fleet's server never held the devices' data: export checks parity on random images, says
    the accuracy was not measured, and refuses what needs training images (int8, static
    BatchNorm)."""
    import edgefl.data
    from edgefl.errors import DataNotFoundError

    _simulate(tmp_path, "r", "-a", "fedavg", monkeypatch=monkeypatch, capsys=capsys)
    _simulate(tmp_path, "bn", "-a", "local", "--model", "hierarchy-width", "--tiers", "1/8",
              "--clients", "1", monkeypatch=monkeypatch, capsys=capsys)

    def absent(name, split, data_dir=None):
        raise DataNotFoundError(f"{name} ({split}) not found. Looked in: nowhere")

    # this machine has no copy of the dataset
    monkeypatch.setattr(edgefl.data, "load_dataset", absent)
    (report, _) = json.loads(
        _cli_ok(
            [
                "export",
                "--run",
                str(tmp_path / "r"),
                "--all",
                "--out",
                str(tmp_path / "onnx"),
                "--json",
            ],
            monkeypatch,
            capsys,
        )
    )
    assert "accuracy" not in report and "not found" in report["accuracy_not_measured"]
    assert (
        report["parity_max_abs_diff"]
        and max(report["parity_max_abs_diff"].values()) <= report["tolerance"]
    )
    infer = json.loads(
        _cli_ok(
            ["infer", str(tmp_path / "onnx" / "d01.onnx"), "--dataset", "synthetic", "--json"],
            monkeypatch,
            capsys,
        )
    )
    # the dataset's names
    assert all(k == v for k, v in infer["class_map"].items()) and len(infer["class_map"]) == 10
    code, _, err = _run(
        [
            "export",
            "--run",
            str(tmp_path / "r"),
            "--all",
            "--out",
            str(tmp_path / "q"),
            "--quantize",
            "int8",
        ],
        monkeypatch,
        capsys,
    )
    assert code == 3 and "int8 calibrates on training images" in err
    code, _, err = _run(
        ["export", "--run", str(tmp_path / "bn"), "--all", "--out", str(tmp_path / "bn-onnx")],
        monkeypatch,
        capsys,
    )
    assert code == 3 and "batch statistics" in err


@pytest.mark.slow  # two worker processes import torch
def test_exporting_in_parallel_writes_the_same_files_and_reports(tmp_path, monkeypatch, capsys):
    """Models exported by two worker processes at once are byte for byte those exported one after
    another in this process, with the same checks and reports (int8 calibration included)."""
    _simulate(tmp_path, "r", "-a", "fedavg", "--clients", "3", monkeypatch=monkeypatch,
              capsys=capsys)
    reports = {}
    for workers in ("1", "2"):
        out = tmp_path / f"onnx-{workers}"
        reports[workers] = json.loads(
            _cli_ok(["export", "--run", str(tmp_path / "r"), "--all", "--out", str(out),
                     "--quantize", "int8", "--calibration-samples", "32", "--workers", workers,
                     "--json"], monkeypatch, capsys))
    one, two = tmp_path / "onnx-1", tmp_path / "onnx-2"
    names = sorted(p.name for p in one.iterdir())
    assert names == sorted(p.name for p in two.iterdir()) and len(names) == 6
    for name in names:
        assert (one / name).read_bytes() == (two / name).read_bytes(), name

    def without_paths(r):
        return {k: v for k, v in r.items() if k != "path"} | {
            "int8": {k: v for k, v in r["int8"].items() if k != "path"}}

    assert [r["device_id"] for r in reports["2"]] == ["d00", "d01", "d02"]
    assert [without_paths(r) for r in reports["1"]] == [without_paths(r) for r in reports["2"]]
    assert all("accuracy" in r["int8"] for r in reports["2"])


def test_simulate_export_writes_what_edgefl_export_writes(tmp_path, monkeypatch, capsys):
    """``simulate --export int8`` exports every device's model to RUN/onnx as ``edgefl export
    --run RUN --all --quantize int8`` with the run's test samples does: the same files, byte for
    byte, and the same reports (in the summary); a format it does not know is refused at once."""
    code, _, err = _run(["simulate", "--export", "fp16"], monkeypatch, capsys)
    assert code == 3 and "--export must be fp32 or int8" in err
    code, _, err = _run(["simulate", "--dataset", "synthetic", "--dp", "local",
                         "--target-epsilon", "8", "--export", "fp32", "--out", str(tmp_path)],
                        monkeypatch, capsys)
    assert code == 3 and "devices keep their final models" in err and not any(tmp_path.iterdir())
    summary = json.loads(_simulate(tmp_path, "r", "-a", "fedavg", "--clients", "3", "--export",
                                   "int8", monkeypatch=monkeypatch, capsys=capsys))
    apart = json.loads(_cli_ok(["export", "--run", str(tmp_path / "r"), "--all", "--out",
                                str(tmp_path / "apart"), "--quantize", "int8", "--test-samples",
                                "100", "--json"], monkeypatch, capsys))
    names = sorted(p.name for p in (tmp_path / "r" / "onnx").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "apart").iterdir()) and len(names) == 6
    for name in names:
        assert (tmp_path / "r" / "onnx" / name).read_bytes() == (
            tmp_path / "apart" / name).read_bytes(), name

    def without_paths(r):
        return {k: v for k, v in r.items() if k != "path"} | {
            "int8": {k: v for k, v in r["int8"].items() if k != "path"}}

    assert [without_paths(r) for r in summary["export"]] == [without_paths(r) for r in apart]
    assert all("accuracy" in r and "accuracy" in r["int8"] for r in apart)
