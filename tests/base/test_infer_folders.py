"""``edgefl infer`` on the base install: a dataset's classes are matched to the model's class
names by name, folders of PNGs give the built-in dataset's accuracy however they are ordered or
spelled, mismatches are refused with the names, and grey and RGB images mix."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edgefl.data.sources import load_arrays
from tests.base.helpers import MODEL, run_edgefl

SAMPLES = 200  # per folder set: enough for accuracy to tell a right mapping from a wrong one


def _infer(*args: str) -> dict:
    result = run_edgefl("infer", str(MODEL), "--json", *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def test_arrays():
    x, y, info = load_arrays("synthetic", "test")
    return x[:SAMPLES], y[:SAMPLES], info.class_names


def _write_folder(root: Path, x, y, names, rgb_every: int = 0) -> Path:
    for i, (img, label) in enumerate(zip(x, y, strict=True)):
        folder = root / names[label]
        folder.mkdir(parents=True, exist_ok=True)
        picture = Image.fromarray(img[0], mode="L")
        if rgb_every and i % rgb_every == 0:
            picture = picture.convert("RGB")  # the same grey in three channels
        picture.save(folder / f"{i:04d}.png")
    return root


@pytest.fixture(scope="module")
def builtin_accuracy():
    return _infer("--dataset", "synthetic", "--limit", str(SAMPLES))["accuracy"]


def test_the_model_is_better_than_chance_so_a_wrong_mapping_would_show(builtin_accuracy):
    assert builtin_accuracy > 0.5


def test_a_test_folder_alone_with_the_models_class_names_gives_the_builtin_accuracy(
    tmp_path, test_arrays, builtin_accuracy
):
    x, y, names = test_arrays
    # no train/, no test/: the class folders themselves
    root = _write_folder(tmp_path / "pics", x, y, names)
    result = _infer("--dataset", f"imagefolder:{root}")
    assert result["accuracy"] == pytest.approx(builtin_accuracy) and result["samples"] == SAMPLES
    assert result["class_map"] == {n: n for n in names}


def test_names_spelled_differently_are_matched_without_case_and_punctuation(
    tmp_path, test_arrays, builtin_accuracy
):
    x, y, names = test_arrays
    spelled = [n.upper().replace("-", "_") for n in names]  # "PATTERN_3" for "pattern-3"
    root = _write_folder(tmp_path / "data" / "test", x, y, spelled)
    result = _infer("--dataset", f"imagefolder:{root.parent}", "--split", "test")
    assert result["accuracy"] == pytest.approx(builtin_accuracy)
    assert result["class_map"]["PATTERN_3"] == "pattern-3"


def test_renamed_and_reordered_folders_need_a_mapping_and_then_give_the_builtin_accuracy(
    tmp_path, test_arrays, builtin_accuracy
):
    x, y, names = test_arrays
    # alphabetical folder order is the reverse of the model's class order
    renamed = [f"{chr(ord('z') - i)}-class" for i in range(len(names))]
    root = _write_folder(tmp_path / "renamed", x, y, renamed)

    refused = run_edgefl("infer", str(MODEL), "--dataset", f"imagefolder:{root}")
    assert refused.returncode == 3
    assert "z-class" in refused.stderr and "match none of the model's classes" in refused.stderr
    assert "--class-map" in refused.stderr

    mapping = [
        arg
        for old, new in zip(renamed, names, strict=True)
        for arg in ("--class-map", f"{old}={new}")
    ]
    result = _infer("--dataset", f"imagefolder:{root}", *mapping)
    assert result["accuracy"] == pytest.approx(builtin_accuracy)


def test_a_mapping_to_a_class_the_model_does_not_have_is_refused(tmp_path, test_arrays):
    x, y, names = test_arrays
    root = _write_folder(tmp_path / "pics", x, y, names)
    result = run_edgefl(
        "infer", str(MODEL), "--dataset", f"imagefolder:{root}", "--class-map", "pattern-0=sandal"
    )
    assert result.returncode == 3 and "sandal" in result.stderr


def test_mixed_grey_and_rgb_images_are_converted_one_by_one(
    tmp_path, test_arrays, builtin_accuracy
):
    x, y, names = test_arrays
    root = _write_folder(tmp_path / "mixed", x, y, names, rgb_every=2)
    assert Image.open(next((root / names[y[0]]).iterdir())).mode in ("L", "RGB")
    result = _infer("--dataset", f"imagefolder:{root}")
    assert result["accuracy"] == pytest.approx(builtin_accuracy)


def test_a_builtin_dataset_whose_classes_the_model_lacks_is_refused():
    # MNIST's classes are digits; the model knows patterns (needs no MNIST files: refused or
    # missing)
    result = run_edgefl("infer", str(MODEL), "--dataset", "synthetic-rgb")
    assert result.returncode != 0 and "Traceback" not in result.stderr


def test_single_images_of_either_mode_are_classified(tmp_path, test_arrays):
    x, _, names = test_arrays
    grey, rgb = tmp_path / "g.png", tmp_path / "c.png"
    Image.fromarray(x[0][0], mode="L").save(grey)
    Image.fromarray(x[0][0], mode="L").convert("RGB").save(rgb)
    result = _infer(str(grey), str(rgb))
    first, second = result["predictions"]
    assert first["name"] == second["name"] and first["name"] in names
    assert first["probability"] == pytest.approx(second["probability"], abs=1e-6)
    assert np.isfinite(first["probability"])


# --- Fashion-MNIST, with its real class names (one of them, "T-shirt/top", cannot be a folder name)

FASHION_MODEL = MODEL.with_name("fashion-cnn.onnx")


@pytest.fixture(scope="module")
def fashion_arrays():
    from edgefl.errors import DataNotFoundError

    try:
        x, y, info = load_arrays("fashion-mnist", "test")
    except DataNotFoundError:
        if os.environ.get("CI") == "true":
            pytest.fail("Fashion-MNIST is missing (CI installs dataset-fashion-mnist)")
        pytest.skip("Fashion-MNIST is not installed")
    return x[:1000], y[:1000], info.class_names


def test_fashion_mnist_folders_named_after_its_classes_give_the_builtin_accuracy(
    tmp_path, fashion_arrays
):
    x, y, names = fashion_arrays
    builtin = json.loads(
        run_edgefl(
            "infer", str(FASHION_MODEL), "--dataset", "fashion-mnist", "--limit", "1000", "--json"
        ).stdout
    )
    assert builtin["accuracy"] > 0.6  # a trained model: a wrong class order would fall towards 10%
    folders = [n.replace("/", "_") for n in names]  # "T-shirt_top"
    root = _write_folder(tmp_path / "fashion", x, y, folders)
    result = run_edgefl("infer", str(FASHION_MODEL), "--dataset", f"imagefolder:{root}", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["accuracy"] == pytest.approx(builtin["accuracy"])
    assert json.loads(result.stdout)["class_map"]["T-shirt_top"] == "T-shirt/top"
