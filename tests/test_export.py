"""ONNX export: every model family exports, passes the checker and matches PyTorch; static
BatchNorm is refused or frozen; int8 quantization; model files written by simulations."""

import json

import numpy as np
import onnx
import pytest
import torch

from edgefl.data import load_dataset
from edgefl.export.checkpoint import load_device_model, load_model_file, save_model_file
from edgefl.export.errors import ExportError, ModelFileError
from edgefl.export.onnx_export import check_parity, export_model, read_metadata
from edgefl.export.quantize import quantize_int8
from edgefl.inference import Predictor
from edgefl.models import ModelSpec, build_model, family_names, family_tiers

SYNTH = load_dataset("synthetic", "test")


def small_spec(family: str, **options) -> ModelSpec:
    """One small instance of a family: its smallest tier, width 0.25 (torchvision: fixed width)."""
    return ModelSpec(
        family,
        family_tiers(family)[0],
        num_classes=10,
        in_shape=SYNTH.info.in_shape,
        width=1.0 if family == "torchvision" else 0.25,
        mean=SYNTH.info.mean,
        std=SYNTH.info.std,
        options=options,
    )


def built(spec: ModelSpec, seed: int = 0):
    torch.manual_seed(seed)
    return build_model(spec).eval()


@pytest.mark.parametrize("family", family_names())
def test_every_family_exports_checks_and_matches_pytorch_at_batch_1_and_7(family, tmp_path):
    # Prepare: hierarchy-width needs bn=running to be batch-independent (static BN: see below)
    spec = small_spec(family, **({"bn": "running"} if family == "hierarchy-width" else {}))
    model = built(spec)
    x = SYNTH.images(np.arange(14))
    # Execute
    report = export_model(
        model, tmp_path / "m.onnx", class_names=SYNTH.info.class_names, parity_images=x
    )
    # Assert: the file is a valid ONNX model with weights inside …
    proto = onnx.load(str(tmp_path / "m.onnx"))
    onnx.checker.check_model(proto, full_check=True)
    assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer)
    assert report.size_bytes == (tmp_path / "m.onnx").stat().st_size
    # … parity was checked at both batch sizes, and holds when measured here independently
    assert sorted(report.parity) == [1, 7] and report.max_abs_diff < 1e-4
    predictor = Predictor(tmp_path / "m.onnx", threads=1)
    with torch.no_grad():
        expected = model(x).numpy()
    for bs in (1, 7):
        got = predictor.logits(x.numpy(), batch_size=bs)
        np.testing.assert_allclose(got, expected, atol=1e-4 * max(1.0, np.abs(expected).max()))
    # the batch dimension is dynamic, the input/output names are the documented ones
    dim = proto.graph.input[0].type.tensor_type.shape.dim[0]
    assert dim.dim_param and not dim.HasField("dim_value")
    assert (proto.graph.input[0].name, proto.graph.output[0].name) == ("images", "logits")


def test_metadata_round_trips_through_the_file(tmp_path):
    spec = small_spec("cnn", dropout="0.25")
    names = [f"class {i}" for i in range(10)]
    export_model(
        built(spec), tmp_path / "m.onnx", class_names=names, metadata={"edgefl.device_id": "d07"}
    )

    meta = read_metadata(tmp_path / "m.onnx")
    predictor = Predictor(tmp_path / "m.onnx")

    assert ModelSpec.from_dict(json.loads(meta["edgefl.spec"])) == spec
    assert predictor.spec == spec and predictor.class_names == names
    assert predictor.input_shape == spec.in_shape
    assert predictor.preprocessing["normalization"] == "inside_model"
    assert predictor.preprocessing["mean"] == list(spec.mean) and predictor.preprocessing[
        "std"
    ] == list(spec.std)
    assert predictor.preprocessing["pixel_range"] == [0.0, 1.0]
    assert meta["edgefl.device_id"] == "d07" and predictor.quantization == "none"


def test_uint8_pixels_are_scaled_like_the_training_pipeline(tmp_path):
    model = built(small_spec("cnn"))
    export_model(model, tmp_path / "m.onnx")
    predictor = Predictor(tmp_path / "m.onnx")
    raw = SYNTH.x[:5].numpy()  # uint8

    got = predictor.logits(raw)

    with torch.no_grad():
        np.testing.assert_allclose(got, model(SYNTH.images(np.arange(5))).numpy(), atol=1e-4)


def test_parity_check_catches_a_model_that_differs_from_the_export(tmp_path):
    spec = small_spec("cnn")
    export_model(built(spec, seed=0), tmp_path / "m.onnx")
    other = built(spec, seed=1)  # same architecture, other weights

    with pytest.raises(ExportError, match="differs from PyTorch"):
        check_parity(other, tmp_path / "m.onnx", SYNTH.images(np.arange(8)))


class _WrongWithOneDNN(torch.nn.Module):
    """A model as torch 2.14.1 computes it on 512-bit SVE: right with oneDNN off, wrong with it on
    (benchmarks/pi/results.md), which cannot be reproduced on the CPUs the tests run on."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        y = self.model(x)
        return y + 0.5 if torch.backends.mkldnn.enabled else y


def test_parity_names_oneDNN_when_pytorch_disagrees_with_its_own_reference_kernels(tmp_path):
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no oneDNN")
    spec = small_spec("cnn")
    model = built(spec, seed=0)
    export_model(model, tmp_path / "m.onnx")
    with pytest.raises(ExportError, match=r"oneDNN.*torch\.backends\.mkldnn\.enabled = False"):
        check_parity(_WrongWithOneDNN(model), tmp_path / "m.onnx", SYNTH.images(np.arange(8)))
    assert torch.backends.mkldnn.enabled  # the diagnosis turned it off for one call only
    with torch.backends.mkldnn.flags(enabled=False):  # with oneDNN off the same model passes
        assert (
            max(
                check_parity(
                    _WrongWithOneDNN(model), tmp_path / "m.onnx", SYNTH.images(np.arange(8))
                ).values()
            )
            < 1e-4
        )


def test_static_batchnorm_is_refused_without_calibration_images(tmp_path):
    model = built(small_spec("hierarchy-width"))  # default bn=static

    with pytest.raises(ExportError, match="bn=running"):
        export_model(model, tmp_path / "m.onnx")
    assert not (tmp_path / "m.onnx").exists()


def test_static_batchnorm_is_frozen_from_calibration_images_and_becomes_batch_independent(tmp_path):
    model = built(small_spec("hierarchy-width"))
    train = load_dataset("synthetic", "train")
    x = SYNTH.images(np.arange(8))

    report = export_model(
        model, tmp_path / "m.onnx", calibration_images=train.images(np.arange(200)), parity_images=x
    )

    assert report.batch_norm == "frozen from 200 calibration images"
    assert model.stem.bn.running_mean is None  # the caller's model is untouched
    predictor = Predictor(tmp_path / "m.onnx")
    alone = np.concatenate([predictor.logits(x[i : i + 1].numpy()) for i in range(8)])
    np.testing.assert_allclose(alone, predictor.logits(x.numpy()), atol=1e-5)
    # frozen statistics sit close to the batch statistics of a large batch of the same data
    with torch.no_grad():
        static = model(train.images(np.arange(200)))[:8]
    frozen = predictor.logits(train.images(np.arange(8)).numpy())
    assert np.abs(frozen - static.numpy()).max() < 0.2 * np.abs(static.numpy()).max()


def test_int8_quantization_shrinks_the_file_keeps_metadata_and_most_predictions(tmp_path):
    # Prepare: a briefly trained tier-4 CNN (3 convs, most weights in conv/FC layers)
    spec = ModelSpec(
        "cnn", "4", 10, SYNTH.info.in_shape, width=0.25, mean=SYNTH.info.mean, std=SYNTH.info.std
    )
    model = built(spec)
    train = load_dataset("synthetic", "train").subset(np.arange(1200))
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    model.train()
    for xb, yb in train.batches(64, shuffle=True, rng=np.random.default_rng(0)):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
    model.eval()
    export_model(model, tmp_path / "m.onnx", class_names=SYNTH.info.class_names)
    # Execute
    q = quantize_int8(tmp_path / "m.onnx", tmp_path / "m.int8.onnx", train.images(np.arange(128)))
    # Assert
    assert q.size_bytes < 0.35 * q.fp32_size_bytes
    onnx.checker.check_model(onnx.load(str(q.path)))
    ops = {n.op_type for n in onnx.load(str(q.path)).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    fp32, int8 = Predictor(tmp_path / "m.onnx"), Predictor(q.path)
    assert (
        int8.spec == spec and int8.class_names == fp32.class_names and "int8" in int8.quantization
    )
    a, b = fp32.evaluate(SYNTH), int8.evaluate(SYNTH)
    assert a["accuracy"] > 0.3  # it learned something, so agreement below is meaningful
    agree = (fp32.predict(SYNTH.x.numpy()) == int8.predict(SYNTH.x.numpy())).mean()
    assert agree > 0.9 and abs(a["accuracy"] - b["accuracy"]) < 0.05


def test_int8_compaction_changes_no_output_and_qoperator_is_the_same_arithmetic(tmp_path):
    # Prepare: a small ResNet-style model whose graph structure outweighs its weights
    spec = small_spec("hierarchy-width")
    model = built(spec)
    calibration = load_dataset("synthetic", "train").images(np.arange(64))
    export_model(model, tmp_path / "m.onnx", calibration_images=calibration)
    x = SYNTH.x[:16].numpy()
    # Execute
    plain = quantize_int8(tmp_path / "m.onnx", tmp_path / "plain.onnx", calibration, compact=False)
    small = quantize_int8(tmp_path / "m.onnx", tmp_path / "small.onnx", calibration)
    qop = quantize_int8(tmp_path / "m.onnx", tmp_path / "qop.onnx", calibration, format="qoperator")
    # Assert: compaction shrinks the file, keeps the interface, metadata and every output bit
    assert small.size_bytes < 0.7 * plain.size_bytes
    graph = onnx.load(str(small.path)).graph
    assert not graph.value_info and all(not n.name for n in graph.node)
    assert [v.name for v in graph.input] == [v.name for v in onnx.load(str(plain.path)).graph.input]
    assert read_metadata(small.path) == read_metadata(plain.path)
    np.testing.assert_array_equal(Predictor(small.path).logits(x), Predictor(plain.path).logits(x))
    # QOperator: integer operators instead of Q/DQ pairs, fewer nodes, the same logits up to
    # rounding
    ops = {n.op_type for n in onnx.load(str(qop.path)).graph.node}
    assert (
        "QLinearConv" in ops
        and "DequantizeLinear" in ops
        and "QOperator" in Predictor(qop.path).quantization
    )
    assert (
        len(onnx.load(str(qop.path)).graph.node) < len(graph.node)
        and qop.size_bytes < small.size_bytes
    )
    scale = np.abs(Predictor(small.path).logits(x)).max()
    assert (
        np.abs(Predictor(qop.path).logits(x) - Predictor(small.path).logits(x)).max()
        <= 0.05 * scale
    )
    with pytest.raises(ExportError, match="qoperator"):
        quantize_int8(tmp_path / "m.onnx", tmp_path / "bad.onnx", calibration, format="int4")


def test_model_file_round_trip_and_foreign_files_are_rejected(tmp_path):
    from safetensors.torch import save_file

    model = built(small_spec("resnet"))
    save_model_file(model, tmp_path / "m.safetensors", dataset="synthetic")
    loaded = load_model_file(tmp_path / "m.safetensors")
    x = SYNTH.images(np.arange(4))
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    assert loaded.spec == model.spec

    save_file({"w": torch.zeros(2)}, str(tmp_path / "foreign.safetensors"))
    with pytest.raises(ModelFileError, match="not an edgefl model file"):
        load_model_file(tmp_path / "foreign.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(ModelFileError, match="not a readable safetensors"):
        load_model_file(tmp_path / "junk.safetensors")


def test_a_simulation_saves_every_device_model_as_it_was_evaluated(tmp_path):
    from conftest import tiny_config

    from edgefl.algorithms.training import evaluate
    from edgefl.runtime.rundata import subsample
    from edgefl.runtime.simulation import simulate

    cfg = tiny_config(tmp_path, algorithm="local", model="cnn", tiers=("1", "2", "3"))
    summary = simulate(cfg)

    run_dir = tmp_path / "run"
    # as the run did
    test = subsample(load_dataset("synthetic", "test"), cfg.test_samples, cfg.seed + 1)
    for device_id, accuracy in summary["client_accuracy"].items():
        model = load_device_model(run_dir, device_id)
        assert (
            model.spec.tier
            == json.loads((run_dir / "config.json").read_text())["fleet"][device_id]["spec"]["tier"]
        )
        assert evaluate(model, test)["accuracy"] == pytest.approx(accuracy)
    with pytest.raises(ModelFileError, match="no saved model"):
        load_device_model(run_dir, "d99")
