"""Model zoo tests, parametrized over the registry: a newly registered family is tested
the moment it is registered."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from edgefl.errors import ConfigError, UnknownNameError
from edgefl.models import (
    EdgeModel,
    ModelSpec,
    build_model,
    family_names,
    family_tiers,
    parameter_count,
    register_family,
    slice_state,
    write_slices,
)

SHAPES = [(1, 28, 28), (3, 32, 32)]
NUM_CLASSES = 7  # distinct from every other dimension in these tests
FIXED_WIDTH_FAMILIES = {"torchvision"}  # architectures whose widths cannot be scaled
ALL_TIERS = [(family, tier) for family in family_names() for tier in family_tiers(family)]
SMALLEST_TIERS = [(family, family_tiers(family)[0]) for family in family_names()]


def small_spec(family: str, tier: str, in_shape=(3, 32, 32), **fields) -> ModelSpec:
    width = 1.0 if family in FIXED_WIDTH_FAMILIES else 0.125
    return ModelSpec(family, tier, NUM_CLASSES, in_shape, **{"width": width, **fields})


def images(spec: ModelSpec, batch: int = 3) -> torch.Tensor:
    return torch.rand(batch, *spec.in_shape, generator=torch.Generator().manual_seed(0))


# --- every family × every tier × both input shapes -----------------------------------------


@pytest.mark.parametrize("in_shape", SHAPES, ids=["1x28x28", "3x32x32"])
@pytest.mark.parametrize("family,tier", ALL_TIERS)
def test_logits_and_features_have_the_spec_shapes(family, tier, in_shape):
    # Prepare
    torch.manual_seed(0)
    spec = small_spec(family, tier, in_shape)
    model = build_model(spec).eval()
    x = images(spec)

    # Execute
    with torch.no_grad():
        logits = model(x)
        features = model.features(x)
        recomposed = model.classify(features)

    # Assert
    assert isinstance(model, EdgeModel) and model.spec == spec
    assert ModelSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert not {"mean", "std"} & set(model.state_dict())
    assert logits.shape == (3, NUM_CLASSES)
    assert features.shape == (3, model.feature_dim)
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(logits, recomposed, rtol=0, atol=0)
    assert isinstance(model.classifier, nn.Linear)
    assert model.classifier.in_features == model.feature_dim
    assert model.classifier.out_features == NUM_CLASSES


@pytest.mark.parametrize("in_shape", SHAPES, ids=["1x28x28", "3x32x32"])
@pytest.mark.parametrize("family,tier", ALL_TIERS)
def test_requested_feature_dim_is_honoured(family, tier, in_shape):
    # Prepare
    torch.manual_seed(0)
    spec = small_spec(family, tier, in_shape, feature_dim=24)

    # Execute
    model = build_model(spec).eval()
    with torch.no_grad():
        features = model.features(images(spec, batch=2))

    # Assert
    assert model.feature_dim == 24
    assert features.shape == (2, 24)
    assert model.classifier.weight.shape == (NUM_CLASSES, 24)


@pytest.mark.parametrize("family,tier", SMALLEST_TIERS)
def test_normalization_happens_inside_and_never_travels(family, tier):
    # Prepare: two models with the same weights, one normalising with mean 0.5 / std 0.25
    torch.manual_seed(0)
    plain = build_model(small_spec(family, tier)).eval()
    normalizing = build_model(small_spec(family, tier, mean=(0.5,), std=(0.25,))).eval()
    normalizing.load_state_dict(plain.state_dict(), strict=True)
    x = images(plain.spec)

    # Execute
    with torch.no_grad():
        inside = normalizing(x)
        outside = plain((x - 0.5) / 0.25)

    # Assert
    torch.testing.assert_close(inside, outside)
    assert not {"mean", "std"} & set(normalizing.state_dict())


@pytest.mark.parametrize("head", ["feddw", "mlp"])
@pytest.mark.parametrize("family,tier", SMALLEST_TIERS)
def test_feddw_and_mlp_heads_put_fc_256_and_128_before_the_classifier(family, tier, head):
    # Prepare
    torch.manual_seed(0)
    spec = small_spec(family, tier, (1, 28, 28), head=head, feature_dim=24)

    # Execute
    model = build_model(spec).eval()
    with torch.no_grad():
        features = model.features(images(spec))

    # Assert
    assert model.feature_dim == 128 and features.shape == (3, 128)
    # FedDW's classifier has no bias; the same network for its baselines ("mlp") keeps it
    assert isinstance(model.classifier, nn.Linear) and (model.classifier.bias is None) == (
        head == "feddw"
    )
    assert model.classifier.weight.shape == (NUM_CLASSES, 128)
    assert any(p.shape == (256, 24) for p in model.parameters())  # fc1 after the projection


# --- specs ---------------------------------------------------------------------------------


def test_spec_round_trips_through_json_exactly():
    # Prepare
    spec = ModelSpec(
        "resnet",
        "50",
        100,
        [3, 32, 32],
        width=0.1,
        feature_dim=512,
        head="feddw",
        mean=[0.4914, 0.4822, 0.4465],
        std=(0.247, 0.243, 0.261),
        options={"stem": "imagenet"},
    )

    # Execute
    back = ModelSpec.from_dict(json.loads(json.dumps(spec.to_dict())))

    # Assert
    assert back == spec and hash(back) == hash(spec)
    assert back.in_shape == (3, 32, 32) and back.options == (("stem", "imagenet"),)
    assert back.to_dict() == spec.to_dict()


@pytest.mark.parametrize(
    "spec,name",
    [
        (ModelSpec("resnet", "18", 10, (3, 32, 32), width=0.25), "resnet18-w0.25"),
        (ModelSpec("cnn", "2", 10, (1, 28, 28)), "cnn2"),
        (
            ModelSpec("hierarchy-width", "1/8", 10, (3, 32, 32), feature_dim=64),
            "hierarchy-width-1_8-d64",
        ),
        (
            ModelSpec("resnet", "10", 10, (3, 32, 32), options=(("stem", "imagenet"),)),
            "resnet10-stem=imagenet",
        ),
    ],
)
def test_spec_name_is_readable(spec, name):
    assert spec.name == name


@pytest.mark.parametrize(
    "fields",
    [
        {"width": 0.0},
        {"num_classes": 0},
        {"in_shape": (3, 32)},
        {"mean": (0.5, 0.5)},
        {"std": (0.0,)},
        {"head": "transformer"},
        {"options": (("stem", "cifar"), ("stem", "imagenet"))},
    ],
)
def test_invalid_spec_values_raise_config_error(fields):
    base = {"family": "resnet", "tier": "18", "num_classes": 10, "in_shape": (3, 32, 32)}
    with pytest.raises(ConfigError):
        ModelSpec(**{**base, **fields})


def test_from_dict_rejects_unknown_fields():
    data = {**ModelSpec("cnn", "1", 10, (1, 28, 28)).to_dict(), "depth": 3}
    with pytest.raises(ConfigError, match="depth"):
        ModelSpec.from_dict(data)


# --- sizes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("in_shape", SHAPES, ids=["1x28x28", "3x32x32"])
@pytest.mark.parametrize("family", family_names())
def test_parameter_count_grows_strictly_with_tier(family, in_shape):
    # Execute
    counts = [
        build_model(small_spec(family, tier, in_shape)).num_parameters
        for tier in family_tiers(family)
    ]

    # Assert
    assert counts == sorted(set(counts)), dict(zip(family_tiers(family), counts, strict=True))


@pytest.mark.parametrize(
    "spec,expected",
    [
        # the well-known CIFAR ResNet-18 (3×3 stem, 10 classes)
        (ModelSpec("resnet", "18", 10, (3, 32, 32)), 11_173_962),
        # conv 1→32 (5×5) + conv 32→64 (5×5) + FC 64·7·7→10
        (ModelSpec("cnn", "2", 10, (1, 28, 28)), 832 + 51_264 + 31_370),
        # torchvision's resnet18 with its 1000-way fc swapped for a 10-way one
        (ModelSpec("torchvision", "resnet18", 10, (3, 32, 32)), 11_689_512 - 513_000 + 5_130),
        # the global multi-exit model's exit 4 has no SepConv: depth tier 4 is ResNet-18
        (ModelSpec("hierarchy-depth", "4", 10, (3, 32, 32)), 11_173_962),
    ],
)
def test_parameter_counts_match_reference_architectures(spec, expected):
    model = build_model(spec)
    assert parameter_count(model) == model.num_parameters == expected


def test_imagenet_stem_differs_from_cifar_stem_only_in_its_kernel():
    # Prepare
    cifar = ModelSpec("resnet", "10", 10, (1, 28, 28), width=0.25)
    imagenet = ModelSpec("resnet", "10", 10, (1, 28, 28), width=0.25, options={"stem": "imagenet"})

    # Execute
    small, large = build_model(cifar), build_model(imagenet)
    logits = large(torch.rand(2, 1, 28, 28))

    # Assert: 7×7 instead of 3×3 kernels on 1 input channel × 16 output channels
    assert large.num_parameters - small.num_parameters == (49 - 9) * 1 * 16
    assert logits.shape == (2, 10)


def test_resnet50_has_bottleneck_features():
    model = build_model(ModelSpec("resnet", "50", 10, (3, 32, 32), width=0.125))
    assert model.feature_dim == 2048 // 8


# --- width tiers: leading slices ---------------------------------------------------------------


@pytest.mark.parametrize("head,feature_dim", [("linear", None), ("feddw", 24)])
@pytest.mark.parametrize("tier", family_tiers("hierarchy-width"))
def test_width_tier_is_the_leading_slice_of_the_global_model(tier, head, feature_dim):
    # Prepare
    torch.manual_seed(0)
    fields = {"head": head, "feature_dim": feature_dim}
    global_model = build_model(small_spec("hierarchy-width", "1", **fields))
    sub = build_model(small_spec("hierarchy-width", tier, **fields))
    shapes = {name: t.shape for name, t in sub.state_dict().items()}

    # Execute
    sliced = slice_state(global_model.state_dict(), shapes)
    sub.load_state_dict(sliced, strict=True)

    # Assert
    assert set(shapes) == set(global_model.state_dict())
    conv = "stages.3.1.conv2.weight"
    full = global_model.state_dict()[conv]
    torch.testing.assert_close(sub.state_dict()[conv], full[: shapes[conv][0], : shapes[conv][1]])
    with torch.no_grad():
        assert sub(images(sub.spec)).shape == (3, NUM_CLASSES)


def test_write_slices_changes_exactly_the_leading_slice():
    # Prepare
    torch.manual_seed(0)
    global_model = build_model(small_spec("hierarchy-width", "1"))
    sub = build_model(small_spec("hierarchy-width", "1/4"))
    before = {k: v.clone() for k, v in global_model.state_dict().items()}
    shapes = {name: t.shape for name, t in sub.state_dict().items()}
    update = {k: v + 1.0 for k, v in slice_state(before, shapes).items()}

    # Execute
    write_slices(global_model.state_dict(), update)  # the state dict shares the model's storage
    after = global_model.state_dict()

    # Assert
    for name, new in update.items():
        region = tuple(slice(0, s) for s in new.shape)
        assert torch.equal(after[name][region], new), name
        rest = torch.ones_like(after[name], dtype=torch.bool)
        rest[region] = False
        assert torch.equal(after[name][rest], before[name][rest]), name
        assert not rest.all()  # a true slice: something was written
    assert all(
        torch.equal(a, b)
        for a, b in zip(slice_state(after, shapes).values(), update.values(), strict=True)
    )


def test_width_tiers_use_static_batch_norm_unless_asked():
    static = build_model(small_spec("hierarchy-width", "1/2")).state_dict()
    running = build_model(
        small_spec("hierarchy-width", "1/2", options={"bn": "running"})
    ).state_dict()
    assert not any("running_mean" in k for k in static)
    assert sum("running_mean" in k for k in running) == 1 + 8 * 2 + 3  # stem, blocks, shortcuts


def test_slicing_rejects_unknown_names_and_larger_shapes():
    state = {"w": torch.zeros(4, 4)}
    with pytest.raises(ConfigError, match="missing"):
        slice_state(state, {"missing": torch.Size([2, 2])})
    with pytest.raises(ConfigError, match="leading slice"):
        write_slices(state, {"w": torch.ones(5, 4)})
    assert torch.equal(state["w"], torch.zeros(4, 4))


# --- depth tiers: a multi-exit ResNet-18 ---------------------------------------------------------


@pytest.mark.parametrize("tier", ["1", "4", "all"])
def test_depth_stride2_stem_keeps_the_parameters_at_half_the_resolution(tier):
    # Prepare: the same tier with the CIFAR stem and with its conv at stride 2
    def spec(**options):
        return ModelSpec("hierarchy-depth", tier, 10, (1, 28, 28), width=0.125, options=options)

    cifar, strided = build_model(spec()), build_model(spec(stem="stride2"))
    x = torch.rand(2, 1, 28, 28)

    # Execute
    stem_out = cifar.stem(x), strided.stem(x)
    exits = strided.forward_exits(x)

    # Assert: same names and shapes (the server averages by name), half the resolution, and
    # every exit still classifies
    assert {k: v.shape for k, v in cifar.state_dict().items()} == {
        k: v.shape for k, v in strided.state_dict().items()
    }
    assert stem_out[0].shape[-2:] == (28, 28) and stem_out[1].shape[-2:] == (14, 14)
    assert all(logits.shape == (2, 10) for _, logits in exits)
    with pytest.raises(ConfigError, match="stem"):
        build_model(spec(stem="imagenet"))


@pytest.mark.parametrize("tier", family_tiers("hierarchy-depth"))
def test_depth_tier_equals_the_global_models_exit(tier):
    # Prepare: a global model whose BN running statistics are not the initial ones
    torch.manual_seed(0)
    global_model = build_model(small_spec("hierarchy-depth", "all"))
    x = images(global_model.spec, batch=4)
    with torch.no_grad():
        global_model(torch.rand(8, 3, 32, 32))
    global_state = global_model.state_dict()
    sub = build_model(small_spec("hierarchy-depth", tier))
    sub_state = sub.state_dict()

    # Execute
    sub.load_state_dict({name: global_state[name] for name in sub_state}, strict=True)
    global_model.eval(), sub.eval()
    with torch.no_grad():
        exits = global_model.forward_exits(x)
        features, logits = sub.features(x), sub(x)

    # Assert
    assert all(global_state[k].shape == v.shape for k, v in sub_state.items())
    assert {k.split(".")[1] for k in sub_state if k.startswith("exits.")} == {tier}
    assert len(exits) == 4
    assert all(s.shape == (4, 64) and p.shape == (4, NUM_CLASSES) for s, p in exits)
    torch.testing.assert_close(features, exits[int(tier) - 1][0])
    torch.testing.assert_close(logits, exits[int(tier) - 1][1])


def test_global_multi_exit_model_forwards_through_exit_4():
    torch.manual_seed(0)
    model = build_model(small_spec("hierarchy-depth", "all")).eval()
    x = images(model.spec)
    with torch.no_grad():
        torch.testing.assert_close(model(x), model.forward_exits(x)[3][1], rtol=0, atol=0)
    assert "all" not in family_tiers("hierarchy-depth")


# --- registry --------------------------------------------------------------------------------


def test_unknown_family_lists_the_families():
    with pytest.raises(UnknownNameError) as caught:
        build_model(ModelSpec("vgg", "16", 10, (3, 32, 32)))
    assert caught.value.choices == tuple(family_names())
    assert "resnet" in str(caught.value) and "hierarchy-width" in str(caught.value)


def test_unknown_tier_lists_the_tiers():
    with pytest.raises(UnknownNameError) as caught:
        build_model(ModelSpec("resnet", "101", 10, (3, 32, 32)))
    assert caught.value.kind == "tier of resnet"
    assert caught.value.choices == ("10", "14", "18", "22", "26", "34", "50")


def test_duplicate_family_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        register_family("resnet", ["1"], "another resnet")(lambda spec: None)
    assert family_tiers("resnet")[0] == "10"


@pytest.mark.parametrize(
    "spec",
    [
        ModelSpec("cnn", "3", 10, (1, 3, 3)),  # too small for two poolings
        ModelSpec("cnn", "3", 10, (1, 28, 28), options={"dropout": "1.5"}),
        ModelSpec("resnet", "18", 10, (3, 32, 32), options={"stem": "huge"}),
        ModelSpec("resnet", "18", 10, (3, 32, 32), options={"depth": "18"}),
        ModelSpec("torchvision", "resnet18", 10, (3, 32, 32), width=0.5),
        ModelSpec("torchvision", "inception_v3", 10, (3, 32, 32)),  # needs at least 75×75
    ],
    ids=["cnn-small", "cnn-dropout", "stem", "unknown-option", "tv-width", "tv-too-small"],
)
def test_incompatible_settings_raise_config_error(spec):
    with pytest.raises(ConfigError):
        build_model(spec)


def test_torchvision_accepts_any_classification_architecture_by_tier():
    model = build_model(ModelSpec("torchvision", "mnasnet0_5", 10, (1, 28, 28)))
    assert model(torch.rand(2, 1, 28, 28)).shape == (2, 10)
    assert model.feature_dim == 1280


def test_a_device_process_does_not_import_torchvision_until_it_needs_it():
    # torchvision costs a device process ~100 MB of private memory (its dataset modules come
    # along); a Raspberry Pi training a zoo ResNet or CNN should not pay for it
    import subprocess
    import sys

    code = (
        "import sys, edgefl.cli.main, edgefl.runtime.device, edgefl.models as m; "
        "m.build_model(m.ModelSpec('cnn', '2', 10, (1, 28, 28))); "
        "assert 'torchvision' not in sys.modules, 'torchvision was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
