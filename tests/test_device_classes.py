"""A device's own image folders are labelled in the run's class order, not by sorted folder names.

An image folder numbers its classes by its sorted folder names (as torchvision's ImageFolder does),
and a device may hold only some classes: left alone, a Pi with folders ``bag``, ``t-shirt-top`` and
``trouser`` would train "bag" as the run's class 0 (T-shirt/top). The server tells every device the
run's class names with its assignment, and the device maps its folders onto them by name.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from edgefl.data import dataset_info
from edgefl.errors import ConfigError, WireError
from edgefl.runtime.assignment import Assignment, align_classes
from edgefl.runtime.dataspec import DataSpec
from edgefl.runtime.setup import load_run_data

FASHION = dataset_info("fashion-mnist").class_names


def _folder(root, classes, per_class=4):
    """One folder per class; every image of class k is filled with the value 10 + 20 * k of its
    position in ``classes``, so each image's true class can be read back from its pixels."""
    for k, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for j in range(per_class):
            Image.fromarray(np.full((28, 28), 10 + 20 * k, np.uint8)).save(root / name / f"{j}.png")
    return root


def test_folders_are_labelled_by_the_run_classes_they_name(tmp_path):
    given = ["trouser", "bag", "t-shirt-top"]  # a device holding 3 of the 10 classes
    data = load_run_data(DataSpec.parse(f"imagefolder:{_folder(tmp_path / 'd', given)}"), 0.0)
    # sorted: bag would be class 0
    assert data.info.class_names == ("bag", "t-shirt-top", "trouser")
    aligned = align_classes(data, FASHION)
    assert aligned.info.class_names == FASHION and aligned.info.num_classes == 10
    for ds in (aligned.train, *aligned.evals.values()):
        # the class each image was made as
        which = (ds.x[:, 0, 0, 0].numpy().astype(int) - 10) // 20
        expected = [
            FASHION.index(
                {"trouser": "Trouser", "bag": "Bag", "t-shirt-top": "T-shirt/top"}[given[k]]
            )
            for k in which
        ]
        assert ds.y.tolist() == expected
        assert set(ds.y.tolist()) <= {0, 1, 8}


def test_data_already_in_the_run_order_is_left_as_it_is(tmp_path):
    data = load_run_data(DataSpec.parse(f"imagefolder:{_folder(tmp_path / 'd', ['a', 'b'])}"), 0.0)
    assert align_classes(data, ("a", "b")) is data
    assert align_classes(data, ()) is data  # a server that does not say its classes


def test_a_folder_that_names_no_class_of_the_run_is_refused_by_name(tmp_path):
    data = load_run_data(
        DataSpec.parse(f"imagefolder:{_folder(tmp_path / 'd', ['bag', 'cat'])}"), 0.0
    )
    with pytest.raises(ConfigError, match="cat"):
        align_classes(data, FASHION)


def _assignment(**kw):
    from edgefl.algorithms import TrainSettings
    from edgefl.models import ModelSpec

    spec = ModelSpec(family="cnn", tier="2", num_classes=10, in_shape=(1, 28, 28))
    return Assignment(spec, "fedavg", {}, TrainSettings(), 3, 0, 0.0, "e1", True, **kw)


def test_the_assignment_carries_the_run_classes_and_checks_them():
    a = _assignment(classes=FASHION)
    assert Assignment.from_meta(a.to_meta()) == a
    meta = a.to_meta()
    del meta["classes"]  # a server from before the field: nothing to align to
    assert Assignment.from_meta(meta).classes == ()
    for bad in (
        "[1, 2]",
        '"T-shirt"',
        '["' + "x" * 201 + '"]',
        "[" + ",".join(['"c"'] * 10_001) + "]",
    ):
        with pytest.raises(WireError):
            Assignment.from_meta({**a.to_meta(), "classes": bad})


def test_the_device_half_trains_on_labels_in_the_run_order(tmp_path):
    from edgefl.runtime.assignment import build_assigned

    root = _folder(tmp_path / "d", ["trouser", "bag"])
    half, evals = build_assigned(
        DataSpec.parse(f"imagefolder:{root}"), _assignment(classes=FASHION), "pi-07"
    )
    train = half.ctx.train_data
    which = (train.x[:, 0, 0, 0].numpy().astype(int) - 10) // 20
    assert train.y.tolist() == [[1, 8][k] for k in which]  # trouser → 1, bag → 8
    assert evals["test"].info.class_names == FASHION
