"""FedVTC's closing phase and whole runs: what each round uploads, the fine-tuning at the finish,
sigma, the closing round's cost, and the oracle's agreement after training."""

import json

import numpy as np
import pytest
import torch

from edgefl.algorithms import (
    DeviceContext,
    DeviceRecord,
    ServerContext,
    TrainSettings,
    get_algorithm,
)
from edgefl.algorithms.fedvtc import (
    PSI,
    SIGMA,
    FedVTCDevice,
    FedVTCOptions,
    FedVTCServer,
    build_decoder,
    feature_statistics,
    generate,
    load_generator,
)
from edgefl.data.datasets import ArrayDataset
from edgefl.errors import ConfigError
from edgefl.models import ModelSpec
from edgefl.runtime.simulation import simulate
from edgefl.wire import Payload
from tests.conftest import tiny_config
from tests.fedvtc_cases import INFO, _changed, _device, _server, _snapshot, _spec


def test_fit_uploads_prototypes_and_sigma_then_only_psi_in_the_closing_round():
    device = _device()
    up = device.fit(0)
    held = sorted(set(device.ctx.train_data.y.tolist()))
    assert up.arrays["proto_classes"].tolist() == held
    assert up.arrays["proto"].shape == (len(held), 980) and up.arrays[SIGMA].shape == (980,)
    assert not any(k.startswith(PSI) for k in up.arrays) and np.isfinite(up.meta["l_dm"])
    before = _snapshot(device.model)
    device.receive(2, Payload({}, {"vtc_seed": 7, "phase": "upload_psi"}))
    closing = device.fit(2)
    assert closing.arrays and all(k.startswith(PSI) for k in closing.arrays)
    assert _changed(before, _snapshot(device.model)) == []  # no training in the closing round


def test_finish_fine_tunes_on_s_over_c_samples_per_known_class():
    device = _device(options={"synthetic_samples": "40", "finetune_epochs": "1"})
    server = _server()
    server.table.aggregate([{0: np.ones(980), 5: -np.ones(980)}])
    before = _snapshot(device.model)
    device.finish(3, server.downlink(3, "d00"))
    x, y = device.synthetic
    # 40 // 10 per class
    assert x.shape == (8, *INFO.in_shape) and sorted(set(y.tolist())) == [0, 5]
    assert _changed(before, _snapshot(device.model))


def test_fine_tune_runs_at_finetune_lr_by_default_and_at_the_runs_lr_with_none(monkeypatch):
    # Prepare: record the lr of every optimizer the fine-tune makes (the run's lr is 0.01)
    import edgefl.algorithms.fedvtc.device as fedvtc

    seen, original = [], fedvtc.make_optimizer

    def recording(params, settings, round):
        seen.append(settings.lr)
        return original(params, settings, round)

    server = _server()
    server.table.aggregate([{0: np.ones(980), 5: -np.ones(980)}])
    lrs = {}
    for value in (None, "none"):
        device = _device(options={"synthetic_samples": "40", "finetune_epochs": "1",
                                  **({} if value is None else {"finetune_lr": value})})
        monkeypatch.setattr(fedvtc, "make_optimizer", recording)
        seen.clear()
        device.finish(3, server.downlink(3, "d00"))
        monkeypatch.undo()
        lrs[value] = seen[:]
    # Assert: the default is 0.001 (issue 17's quick-command sweep); none is the run's lr
    assert lrs[None] == [0.001] and lrs["none"] == [TrainSettings().lr]


def test_fedvtc_trains_two_local_epochs_by_default_and_fedproto_one():
    assert get_algorithm("fedvtc").defaults["epochs"] == 2
    assert get_algorithm("fedproto").defaults["epochs"] == 1
    rest = {k: v for k, v in get_algorithm("fedvtc").defaults.items() if k != "epochs"}
    assert rest == {k: v for k, v in get_algorithm("fedproto").defaults.items() if k != "epochs"}


def test_sample_sigma_scale_shrinks_the_noise_around_each_prototype():
    server = _server()
    server.table.aggregate([{0: np.ones(980), 5: -np.ones(980)}])
    spread = {}
    for scale in ("1.0", "0"):
        device = _device(
            options={"synthetic_samples": "40", "finetune_epochs": "1", "sample_sigma_scale": scale}
        )
        device.finish(3, server.downlink(3, "d00"))
        x, y = device.synthetic
        spread[scale] = float(x[y == 0].std(0).max())
    assert spread["0"] < 1e-6 < spread["1.0"]  # scale 0: every sample of a class is ψ(c^y)
    with pytest.raises(ValueError):
        FedVTCOptions(sample_sigma_scale=-1.0)


def test_fedvtc_run_has_a_closing_round_and_per_round_psi_costs_more(tmp_path):
    gen = tmp_path / "gen.safetensors"
    single = simulate(
        tiny_config(
            tmp_path / "a",
            algorithm="fedvtc",
            fraction=1.0,
            options={"save_generator": str(gen), "synthetic_samples": "50", "finetune_epochs": "1"},
        ),
        plots=False,
    )
    rounds = [
        json.loads(line) for line in (tmp_path / "a/run/rounds.jsonl").read_text().splitlines()
    ]
    assert [r["phase"] for r in rounds] == ["train", "train", "closing"]
    assert rounds[2]["selected"] == rounds[2]["completed"] == ["d00", "d01", "d02"]
    assert rounds[2]["server"]["psi_uploads"] == 3.0
    psi, protos, known, sigma = load_generator(gen)
    assert known.all() and protos.shape == (10, 980) and (sigma > 0).all()
    x, _ = generate(psi, protos, sigma, [0, 1], 2)
    assert x.shape == (4, *INFO.in_shape)

    every = simulate(
        tiny_config(
            tmp_path / "b",
            algorithm="fedvtc",
            fraction=1.0,
            options={"psi_every_round": "true", "synthetic_samples": "50", "finetune_epochs": "1"},
        ),
        plots=False,
    )
    assert len(every["bytes_up_per_round"]) == 2  # no closing round
    # ψ ≈ 84 kB each
    assert every["bytes_up_per_round"][0] > single["bytes_up_per_round"][0] + 3 * 60_000
    assert sum(every["bytes_up_per_round"]) > sum(single["bytes_up_per_round"])


def test_every_training_round_keeps_its_evaluation_and_closing_rounds_have_none(tmp_path):
    """The curve is on the per-round split from the first training round to the last (for FedVTC
    the models before the fine-tune, whose final evaluation comes after it), with ψ every round
    (no closing round) as with the closing round, and for a method whose finish trains nothing."""

    def evaluated(run_dir):
        rounds = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
        return [(r["phase"], "eval" in r) for r in rounds]

    opts = {"synthetic_samples": "50", "finetune_epochs": "1"}
    simulate(
        tiny_config(
            tmp_path / "every",
            algorithm="fedvtc",
            fraction=1.0,
            eval_every=1,
            options={**opts, "psi_every_round": "true"},
        ),
        plots=False,
    )
    assert evaluated(tmp_path / "every/run") == [("train", True), ("train", True)]
    simulate(
        tiny_config(
            tmp_path / "once", algorithm="fedvtc", fraction=1.0, eval_every=1, options=opts
        ),
        plots=False,
    )
    assert evaluated(tmp_path / "once/run") == [
        ("train", True),
        ("train", True),
        ("closing", False),
    ]
    # its finish trains nothing: the last round is evaluated all the same (one evaluation set)
    simulate(tiny_config(tmp_path / "fedavg", algorithm="fedavg", eval_every=1), plots=False)
    assert evaluated(tmp_path / "fedavg/run") == [("train", True), ("train", True)]


def test_first_round_starts_from_the_devices_class_means_and_feature_spread():
    device = _device(n=96)
    fresh = _device(n=96)  # the same seed: the same initial model
    means, spread = feature_statistics(fresh.model, fresh.ctx.train_data)
    assert (
        set(means) == set(device.ctx.train_data.y.tolist())
        and spread.shape == (980,)
        and (spread > 0).all()
    )
    # no global prototype yet: each held class starts from its local mean, σ from the spread
    device.fit(0)
    for c, m in means.items():
        assert torch.allclose(device.protos[c], torch.from_numpy(m), atol=1e-5)
    fresh.initialise_from_data()
    assert torch.allclose(
        fresh.log_sigma.exp(), torch.from_numpy(np.maximum(spread, 1e-3)), rtol=1e-5
    )
    # a global prototype wins over the local mean; init_prototypes=zero and a numeric σ are the old
    # behaviour
    other = _device(options={"init_prototypes": "zero", "init_sigma": "1"})
    other.receive(
        0,
        Payload(
            {"proto": np.full((1, 980), 2.0, np.float32), "proto_classes": np.array([3])},
            {"vtc_seed": 7},
        ),
    )
    other.initialise_from_data()
    assert float(other.protos[3].mean()) == 2.0 and float(other.protos.abs().sum()) == 2.0 * 980
    assert torch.equal(other.log_sigma.detach(), torch.zeros(980))


def test_server_sends_sigma_only_once_the_devices_measured_it():
    server = _server()
    assert SIGMA not in server.downlink(0, "d00").arrays and SIGMA not in server.state_dict()
    server.ctx.round = 0
    sigma = np.full(980, 0.2, np.float32)
    server.aggregate(
        0,
        {
            "d00": Payload(
                {
                    "proto": np.ones((1, 980), np.float32),
                    "proto_classes": np.array([1]),
                    SIGMA: sigma,
                },
                {},
            )
        },
    )
    assert np.allclose(server.downlink(1, "d00").arrays[SIGMA], 0.2)
    # the paper's σ = 1
    assert np.allclose(_server(init_sigma="1").downlink(0, "d00").arrays[SIGMA], 1.0)


def _bands(n: int, seed: int, classes: int = 4) -> ArrayDataset:
    """A fixed easy case: class c is a bright horizontal band at rows 7c..7c+6, plus noise."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes
    x = np.full((n, *INFO.in_shape), 30.0)
    for i, c in enumerate(y):
        x[i, :, 7 * c : 7 * c + 7, :] = 220.0
    x += rng.normal(0, 20, x.shape)
    return ArrayDataset.from_numpy(np.clip(x, 0, 255).astype(np.uint8), y, INFO)


def test_oracle_agreement_after_training_psi_is_well_above_chance(tmp_path):
    """One device trains ψ for 3 rounds × 10 steps on four classes; the server averages it and
    a classifier trained apart (the oracle) scores ψ's samples. Measured: 1.0 after training
    against 0.25 (chance among four classes) for the untrained ψ; the device's own model 0.75."""
    import torch.nn.functional as F

    from edgefl.models import build_model
    from edgefl.models.files import save_model_file

    torch.manual_seed(0)
    oracle = build_model(ModelSpec("cnn", "1", 10, INFO.in_shape, width=0.25))
    opt = torch.optim.Adam(oracle.parameters(), 3e-3)
    rng = np.random.default_rng(0)
    for epoch in range(3):
        for x, y in _bands(160, 1 + epoch).batches(16, shuffle=True, rng=rng):
            opt.zero_grad()
            F.cross_entropy(oracle(x), y).backward()
            opt.step()
    path = save_model_file(oracle.eval(), tmp_path / "oracle.safetensors")
    held_out = _bands(80, 9)
    assert float((oracle(held_out.x.float() / 255).argmax(1) == held_out.y).float().mean()) == 1.0

    rounds, spec = 3, _spec()
    options = get_algorithm("fedvtc").parse_options({"oracle": str(path)})
    ctx = DeviceContext(
        "d00",
        spec,
        _bands(160, 0),
        TrainSettings(batch_size=16, steps=10, lr=0.01, momentum=0.0),
        seed=1,
        rounds=rounds,
    )
    device = FedVTCDevice(ctx, options)
    server = FedVTCServer(
        ServerContext(
            10,
            {"d00": DeviceRecord(spec, 160)},
            TrainSettings(),
            rounds=rounds,
            seed=0,
            fraction=1.0,
            closing_rounds=1,
        ),
        options,
    )
    for r in range(rounds + 1):
        server.ctx.round = r
        device.receive(r, server.downlink(r, "d00"))
        if r == rounds:  # before the closing round: the same prototypes and σ, the untrained ψ
            untrained = FedVTCServer(server.ctx, options)
            untrained.table, untrained.sigma = server.table, server.sigma
            untrained.psi = dict(build_decoder_arrays(untrained))
            assert untrained.oracle_metrics(r)["oracle_agreement"] <= 0.5
        metrics = server.aggregate(r, {"d00": device.fit(r)})
    assert metrics["psi_uploads"] == 1.0
    assert metrics["oracle_agreement"] >= 0.9
    assert {f"oracle_agreement_{c}" for c in range(4)} <= set(metrics)
    assert metrics["device_agreement"] >= 0.5


def build_decoder_arrays(server: FedVTCServer):
    from edgefl.wire import state_to_arrays

    return state_to_arrays(build_decoder(server.layout, server.vtc_seed).state_dict(), PSI)


def test_an_oracle_that_does_not_fit_the_fleet_is_refused(tmp_path):
    from edgefl.models import build_model
    from edgefl.models.files import save_model_file

    rgb = save_model_file(
        build_model(ModelSpec("cnn", "1", 10, (3, 32, 32), width=0.25)),
        tmp_path / "rgb.safetensors",
    )
    with pytest.raises(ConfigError, match="oracle"):
        _server(oracle=str(rgb))
    with pytest.raises(ConfigError, match="oracle"):
        _server(oracle=str(tmp_path / "missing.safetensors"))
