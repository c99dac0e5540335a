"""The names the registries hold, known without importing them.

Algorithms and model families register themselves when their modules are imported, and those
modules import torch (seconds on a small machine). The command line checks a name, and lists the
choices in ``--help``, from this catalogue instead, so that ``edgefl simulate --algorithm nope``
fails at once and without torch. ``tests/test_names.py`` holds it equal to the registries.
"""

from __future__ import annotations

from edgefl.errors import UnknownNameError

#: Algorithm name → the module of :mod:`edgefl.algorithms` that registers it.
ALGORITHMS: dict[str, str] = {
    "fedavg": "fedavg",
    "feddw": "feddw",
    "fedhe": "felo",
    "fedhenn": "fedhenn",
    "fedproto": "fedproto",
    "fedprox": "fedprox",
    "fedprox-dw": "feddw",
    "fedrep": "fedrep",
    "fedvtc": "fedvtc",
    "felo": "felo",
    "heterofl": "hierarchyfl",
    "hierarchyfl": "hierarchyfl",
    "local": "local",
    "velo": "felo",
}

#: Model family → its tiers, smallest first (:func:`edgefl.models.family_tiers`).
MODEL_FAMILIES: dict[str, tuple[str, ...]] = {
    "cnn": ("1", "2", "3", "4", "5"),
    "hierarchy-depth": ("1", "2", "3", "4"),
    "hierarchy-width": ("1/8", "1/4", "1/2", "1"),
    "resnet": ("10", "14", "18", "22", "26", "34", "50"),
    "torchvision": ("shufflenet_v2_x0_5", "mobilenet_v3_small", "efficientnet_b0", "resnet18"),
}

#: Dataset names (:func:`edgefl.data.dataset_names`); ``imagefolder`` is used as
#: ``imagefolder:DIR``.
DATASETS: tuple[str, ...] = (
    "cifar10", "cifar100", "cinic10", "fashion-mnist", "imagefolder", "mnist", "synthetic",
    "synthetic-rgb",
)  # fmt: skip


def check_algorithm(name: str) -> str:
    if name not in ALGORITHMS:
        raise UnknownNameError("algorithm", name, sorted(ALGORITHMS))
    return name


def check_model(name: str) -> str:
    if name not in MODEL_FAMILIES:
        raise UnknownNameError("model family", name, sorted(MODEL_FAMILIES))
    return name


def check_dataset(name: str) -> str:
    """``NAME`` or ``NAME:...`` (``imagefolder:DIR``, ``fashion-mnist:shard=1/4``)."""
    if name.partition(":")[0].strip().lower() not in DATASETS:
        raise UnknownNameError("dataset", name, DATASETS)
    return name


def listing(names) -> str:
    return ", ".join(sorted(names))
