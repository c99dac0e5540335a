"""Server optimizers (edgefl.algorithms.server_opt; Reddi et al. 2021): one step of each matches
the update computed by hand, buffers keep the plain average, the state survives a checkpoint, and
every method that declares averaged weights runs with one (its conformance cases are in
test_conformance: memory ≡ MQTT and checkpoint → resume)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from edgefl.algorithms.server_opt import ServerOptimizer, ServerOptSettings
from edgefl.errors import ConfigError
from tests.commands import flags
from tests.conftest import tiny_config

CURRENT = {"w": np.array([1.0, -2.0], np.float32)}
AVERAGED = {"w": np.array([1.5, -2.5], np.float32)}  # Δ = (+0.5, −0.5)
TAU = 1e-3


def one_step(name: str, lr: float, **kw) -> np.ndarray:
    opt = ServerOptimizer(ServerOptSettings(name, lr, **kw))
    return opt.step("global", CURRENT, AVERAGED, {"w"})["w"]


def test_fedavg_installs_the_average_unchanged():
    out = ServerOptimizer().step("global", CURRENT, AVERAGED, {"w"})
    assert out["w"] is AVERAGED["w"]


def test_fedavgm_one_step_by_hand():
    # m = Δ = ±0.5 (no momentum yet); x + η·m with η = 0.5
    np.testing.assert_allclose(one_step("fedavgm", 0.5), [1.25, -2.25], rtol=1e-6)


def test_fedavgm_second_step_carries_the_momentum():
    opt = ServerOptimizer(ServerOptSettings("fedavgm", 1.0, beta1=0.9))
    x1 = opt.step("g", CURRENT, AVERAGED, {"w"})  # m = (0.5, -0.5), x1 = (1.5, -2.5)
    # Δ = 0.1: m = 0.45 + 0.1, -0.45 + 0.1
    x2 = opt.step("g", x1, {"w": x1["w"] + np.float32(0.1)}, {"w"})
    np.testing.assert_allclose(x2["w"], [1.5 + 0.55, -2.5 - 0.35], rtol=1e-6)


def test_fedadam_one_step_by_hand():
    # m = 0.1·0.5 = 0.05; v = 0.99·τ² + 0.01·0.25 = 0.00250099; x + 0.1·m/(√v + τ)
    step = 0.1 * 0.05 / (math.sqrt(0.99e-6 + 0.0025) + TAU)
    np.testing.assert_allclose(one_step("fedadam", 0.1), [1.0 + step, -2.0 - step], rtol=1e-6)


def test_fedyogi_one_step_by_hand():
    # v₀ = τ² < Δ² = 0.25: sign(v₀ − Δ²) = −1, so v = τ² + 0.01·0.25 = 0.002501
    step = 0.1 * 0.05 / (math.sqrt(1e-6 + 0.0025) + TAU)
    np.testing.assert_allclose(one_step("fedyogi", 0.1), [1.0 + step, -2.0 - step], rtol=1e-6)


def test_fedyogi_shrinks_v_when_the_update_is_smaller_than_its_history():
    opt = ServerOptimizer(ServerOptSettings("fedyogi", 0.1))
    x1 = opt.step("g", CURRENT, AVERAGED, {"w"})  # v = 0.002501, m = ±0.05
    x2 = opt.step("g", x1, {"w": x1["w"] + np.float32(0.01)}, {"w"})  # Δ² = 1e-4 < v: v − 0.01·1e-4
    v = 0.002501 - 0.01 * 1e-4
    m = np.array([0.9 * 0.05 + 0.1 * 0.01, -0.9 * 0.05 + 0.1 * 0.01])
    np.testing.assert_allclose(
        x2["w"], x1["w"].astype(np.float64) + 0.1 * m / (math.sqrt(v) + TAU), rtol=1e-6
    )
    np.testing.assert_allclose(opt.v["g"]["w"], [v, v], rtol=1e-9)


def test_fedadagrad_one_step_by_hand():
    # v = τ² + Δ² = 0.250001
    step = 10**-1.5 * 0.05 / (math.sqrt(0.250001) + TAU)
    np.testing.assert_allclose(
        one_step("fedadagrad", 10**-1.5), [1.0 + step, -2.0 - step], rtol=1e-6
    )


def test_the_default_lr_and_betas_are_the_papers():
    s = ServerOptSettings("fedadam")
    assert (s.beta1, s.beta2, s.eps) == (0.9, 0.99, 1e-3)
    assert ServerOptSettings("fedavgm").eta == 1.0


def test_buffers_and_integer_tensors_keep_the_plain_average():
    current = {
        "w": np.ones(2, np.float32),
        "bn.running_var": np.ones(2, np.float32),
        "bn.num_batches_tracked": np.array(3),
    }
    averaged = {
        "w": np.full(2, 2.0, np.float32),
        "bn.running_var": np.full(2, 0.5, np.float32),
        "bn.num_batches_tracked": np.array(5),
    }
    out = ServerOptimizer(ServerOptSettings("fedadam", 0.1)).step(
        "g", current, averaged, {"w", "bn.num_batches_tracked"}
    )
    np.testing.assert_array_equal(out["bn.running_var"], [0.5, 0.5])
    assert out["bn.num_batches_tracked"] == 5
    # the parameter took the Adam step
    assert out["w"].dtype == np.float32 and not np.allclose(out["w"], 2.0)


def test_state_dict_resumes_the_same_trajectory():
    a = ServerOptimizer(ServerOptSettings("fedadam", 0.05))
    x1 = a.step("resnet10", CURRENT, AVERAGED, {"w"})
    b = ServerOptimizer(ServerOptSettings("fedadam", 0.05))
    b.load_state_dict({**a.state_dict(), "w/ignored": np.zeros(1)})
    nxt = {"w": x1["w"] + np.float32(0.2)}
    np.testing.assert_array_equal(
        b.step("resnet10", x1, nxt, {"w"})["w"], a.step("resnet10", x1, nxt, {"w"})["w"]
    )
    assert sorted(a.state_dict()) == ["opt|resnet10|m|w", "opt|resnet10|v|w"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "adam"}, "choose one of"),
        ({"name": "fedadam", "lr": 0.0}, "lr"),
        ({"beta1": 1.0}, "beta1"),
        ({"eps": 0.0}, "eps"),
    ],
)
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ServerOptSettings(**kwargs)


# --- in runs
# ---------------------------------------------------------------------------------------


def final_state(tmp_path: Path, name: str, **overrides) -> dict[str, np.ndarray]:
    from edgefl.runtime.simulation import simulate

    box = {}
    cfg = tiny_config(tmp_path, run_name=name, eval_every=0, **overrides)
    simulate(cfg, plots=False, on_done=lambda s: box.__setitem__("state", s.state_dict()))
    return box["state"]


@pytest.mark.parametrize("algorithm", ["fedavg", "heterofl"])
def test_fedavgm_without_momentum_at_lr_1_is_plain_averaging_and_fedadam_is_not(
    tmp_path, algorithm
):
    # Prepare / Execute: the same run three ways
    plain = final_state(tmp_path, "plain", algorithm=algorithm)
    sgd = final_state(
        tmp_path, "sgd", algorithm=algorithm, server_opt="fedavgm", server_opt_betas=(0.0, 0.99)
    )
    adam = final_state(tmp_path, "adam", algorithm=algorithm, server_opt="fedadam")
    # Assert: FedAvgM(β=0, η=1) is averaging; FedAdam moved the weights elsewhere and kept moments
    weights = [k for k in plain if k.startswith("w/") and plain[k].dtype.kind == "f"]
    for k in weights:
        np.testing.assert_allclose(sgd[k], plain[k], atol=1e-6, err_msg=k)
    assert max(float(np.abs(adam[k] - plain[k]).max()) for k in weights) > 1e-3
    assert any(k.startswith("opt|global|v|") for k in adam)


def test_felo_steps_each_architecture_apart(tmp_path):
    state = final_state(
        tmp_path,
        "felo",
        algorithm="felo",
        tiers=("10", "14"),
        server_opt="fedyogi",
        options={"warmup_fraction": "0"},
    )
    groups = {k.split("|")[1] for k in state if k.startswith("opt|")}
    # devices d00 and d02 share ResNet10; d01 alone has ResNet14: nothing to average
    assert len(groups) == 1


def test_a_method_without_averaged_weights_refuses_a_server_optimizer(tmp_path):
    from edgefl.runtime.setup import assemble

    with pytest.raises(ConfigError, match="averages no model weights"):
        assemble(tiny_config(tmp_path, algorithm="fedproto", server_opt="fedadam"))
    # Felo without its weight averaging
    with pytest.raises(ConfigError, match="averages no model weights"):
        assemble(
            tiny_config(
                tmp_path,
                algorithm="felo",
                server_opt="fedadam",
                options={"average_weights": "false"},
            )
        )


def test_central_privacy_refuses_a_server_optimizer_and_local_privacy_takes_one(tmp_path):
    from edgefl.runtime.setup import assemble

    dp = {"dp_noise_multiplier": "1.0"}
    # noise calibrated for the plain average
    with pytest.raises(ConfigError, match="with --dp central is not supported"):
        assemble(tiny_config(tmp_path, server_opt="fedadam", options={"dp": "central", **dp}))
    run = assemble(tiny_config(tmp_path, server_opt="fedadam", options={"dp": "local", **dp}))
    assert run.method.privacy.mode == "local"


def test_cli_flags_reach_the_run(tmp_path):
    from typer.testing import CliRunner

    from edgefl.cli.main import app

    result = CliRunner().invoke(
        app,
        [
            "simulate",
            *flags(dataset="synthetic", clients=2, rounds=1, steps=1, width=0.25,
                   train_samples=200, test_samples=50, eval_samples=50, server_opt="fedyogi",
                   server_opt_lr=0.05, server_opt_betas="0.8,0.95", server_opt_eps="1e-4",
                   out=tmp_path, run_name="cli", quiet=True, json=True),
        ],
    )
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "cli" / "config.json").read_text())
    assert (
        config["server_opt"],
        config["server_opt_lr"],
        config["server_opt_betas"],
        config["server_opt_eps"],
    ) == ("fedyogi", 0.05, [0.8, 0.95], 1e-4)
