"""``edgefl train --data NAME:key=value,...`` and a method's ``-o key=value`` options: parsed and
validated by pydantic, each mistake named with the option and what it takes."""

import dataclasses

import pytest

from edgefl.errors import ConfigError
from edgefl.runtime.dataspec import DataSpec


def test_text_round_trips():
    spec = DataSpec("synthetic", shard=(2, 5), partition="dirichlet", alpha=0.3,
                    classes_per_client=3, seed=7, train_samples=600, public=0.1,
                    data_dir="/data", validation_samples=50)
    assert DataSpec.parse(spec.to_string()) == spec
    assert DataSpec.parse("imagefolder:/srv/pics:shard=0/2,k=4") == DataSpec(
        "imagefolder:/srv/pics", shard=(0, 2), classes_per_client=4
    )
    assert DataSpec.parse("imagefolder:/srv/pics") == DataSpec("imagefolder:/srv/pics")
    assert DataSpec.parse("fashion-mnist: seed = 3 ,alpha=1e-1,") == DataSpec(
        "fashion-mnist", seed=3, alpha=0.1
    )
    assert dataclasses.replace(spec, shard=(0, 1)).shard == (0, 1)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "name a dataset"),
        (":seed=1", "name a dataset"),
        (
            "synthetic:seed=1,alpha",
            "use key=value with keys alpha, classes_per_client, dir, eval_samples, k,",
        ),
        ("synthetic:colour=red", "use key=value with keys"),
        ("synthetic:seed=x", "seed='x': Input should be a valid integer"),
        ("synthetic:seed=1.5", "seed='1.5': Input should be a valid integer"),
        ("synthetic:alpha=lots", "alpha='lots': Input should be a valid number"),
        ("synthetic:k=two", "k='two': Input should be a valid integer"),
        (
            "synthetic:partition=random",
            "partition='random': Input should be 'iid', 'dirichlet' or 'shards'",
        ),
        ("synthetic:shard=1", "shard='1'"),
        ("synthetic:shard=a/2", "shard="),
        ("synthetic:shard=2/2", "shard 2/2: need 0 <= I < N"),
        ("synthetic:shard=-1/2", "shard -1/2: need 0 <= I < N"),
    ],
)
def test_a_mistake_is_named(text, says):
    with pytest.raises(ConfigError, match="^--data ") as e:
        DataSpec.parse(text)
    assert says in str(e.value)


def test_the_fields_are_checked_in_code_too():
    with pytest.raises(ValueError, match="need 0 <= I < N"):
        DataSpec("synthetic", shard=(3, 3))
    with pytest.raises(ValueError, match="seed"):
        DataSpec("synthetic", seed="many")


def test_method_options_from_text_and_typed_values():
    from edgefl.algorithms import get_algorithm

    feddw = get_algorithm("feddw")
    assert feddw.parse_options({"lam_decay_rounds": "3, 6"}).lam_decay_rounds == (3, 6)
    assert feddw.parse_options({"lam_decay_rounds": [4]}).lam_decay_rounds == (4,)
    assert feddw.parse_options({"lam_decay_rounds": ""}).lam_decay_rounds == ()
    prox = get_algorithm("fedprox")
    assert prox.parse_options({"mu": "1e-2"}).mu == 0.01
    assert prox.parse_options({"mu": 1}).mu == 1.0


@pytest.mark.parametrize(
    ("method", "options", "says"),
    [
        ("fedprox", {"mu": "lots"}, "fedprox option mu='lots' is not a valid float"),
        ("fedprox", {"mu": 2.5j}, "is not a valid float"),
        (
            "feddw",
            {"missing_class": "zero"},
            "feddw option missing_class='zero': choose one of onehot, keep",
        ),
        (
            "feddw",
            {"lam_decay_rounds": "3,x"},
            "lam_decay_rounds='3,x' is not a valid comma-separated list of int",
        ),
        ("feddw", {"lam_decay_rounds": "none"}, "is not a valid comma-separated list of int"),
        ("fedprox", {"nu": "1"}, "fedprox has no option nu"),
        ("fedprox", {"mu": "-1"}, "mu must be >= 0"),
    ],
)
def test_a_bad_option_is_named(method, options, says):
    from edgefl.algorithms import get_algorithm

    with pytest.raises(ConfigError) as e:
        get_algorithm(method).parse_options(options)
    assert says in str(e.value)
