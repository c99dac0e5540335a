"""edgefl.names (what the CLI checks before importing torch) holds what the registries hold."""

import importlib
import inspect

from edgefl import names
from edgefl.algorithms import algorithm_names, get_algorithm
from edgefl.data import dataset_names
from edgefl.models import family_names, family_tiers


def test_the_algorithm_names_are_the_registry_and_each_module_registers_its_own():
    assert sorted(names.ALGORITHMS) == algorithm_names()
    for name, module in names.ALGORITHMS.items():
        source = inspect.getsource(importlib.import_module(f"edgefl.algorithms.{module}"))
        assert f'name="{name}"' in source, (name, module)
        assert get_algorithm(name).name == name


def test_the_model_families_and_tiers_are_the_registry():
    assert sorted(names.MODEL_FAMILIES) == sorted(family_names())
    for family, tiers in names.MODEL_FAMILIES.items():
        assert list(tiers) == family_tiers(family), family


def test_the_dataset_names_are_the_registry():
    assert sorted(names.DATASETS) == dataset_names()
