"""The conformance suite: every registered method passes every check here by being registered.

Parametrized over the method registry (as torchvision's model tests are), on tiny synthetic data,
2 rounds, 3 devices and each method's smallest default models:

- memory ≡ MQTT: the same seed gives the same server state and device models (within 1e-6) in
  memory and over the embedded broker, with the device side built by the device process's own
  code (``DeviceRuntime``: registration, assignment, the run assembly), one torch thread each;
- checkpoint → resume: a run interrupted after round 1 and resumed from its checkpoint by a new
  server ends in the same state as an uninterrupted run;
- a malformed downlink (wrong shape, wrong dtype, NaN, missing key, an undeclared array, wrong
  algorithm; a real downlink of round 1, so that what a method only sends once the server holds
  state is there to spoil) is rejected by the device as a ``WireError`` and the device keeps
  serving; a malformed uplink likewise on the server (the round goes on with the others). The
  cases a method gets follow its declared arrays (``expected_downlink``, ``expected_uplink``):
  a method whose messages carry no arrays (Local) gets the wrong algorithm and an undeclared array;
- the bytes each round records are the bytes the MQTT transport published and received;
- every tier of the method's default fleet exports to ONNX (parity-checked).

Device processes are threads of the test process here (one broker for the module): their local
work is serialised by a lock, because torch's generator, which the agent seeds per device and
round, is process-wide. The MQTT and ONNX cases carry the ``slow`` marker; CI runs them too
(``make test`` deselects nothing).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import tempfile
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

from edgefl.algorithms import DeviceRecord, algorithm_names
from edgefl.errors import EdgeflError
from edgefl.runtime import agent as agent_module
from edgefl.runtime import device as device_module
from edgefl.runtime.agent import DeviceAgent
from edgefl.runtime.dataspec import DataSpec
from edgefl.runtime.device import DeviceOptions, DeviceRuntime
from edgefl.runtime.exchange import LoopSettings
from edgefl.runtime.fleet import SIMULATED_PROFILE
from edgefl.runtime.loop import RoundLoop
from edgefl.runtime.server import ServeOptions, serve
from edgefl.runtime.setup import assemble
from edgefl.runtime.simulation import simulate
from edgefl.transport import InMemoryTransport
from edgefl.transport.broker import EmbeddedBroker
from edgefl.wire import Envelope, Payload, decode, encode
from tests.conftest import SMALL_WORK, scaled, tiny_config

METHODS = algorithm_names()
TOLERANCE = 1e-6


def conformance_config(tmp_path: Path, name: str, options: dict | None = None, **overrides):
    """3 devices, 2 rounds of 2 steps of 8 samples, every device every round, one torch thread
    (as a device process); the method's small-work options and ``options``."""
    settings = {
        "clients": 3,
        "rounds": 2,
        "steps": 2,
        "batch_size": 8,
        "test_samples": 100,
        "fraction": 1.0,
        "threads": 1,
    }
    return tiny_config(
        tmp_path,
        algorithm=name,
        options={**SMALL_WORK.get(name, {}), **(options or {})},
        **{**settings, **overrides},
    )


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def assert_states_equal(got: dict, expected: dict, what: str) -> None:
    assert set(got) == set(expected), f"{what}: keys differ: {sorted(set(got) ^ set(expected))[:5]}"
    for k in expected:
        a, b = np.asarray(got[k]), np.asarray(expected[k])
        assert a.shape == b.shape, f"{what} {k}: shape {a.shape} != {b.shape}"
        np.testing.assert_allclose(
            a.astype(np.float64),
            b.astype(np.float64),
            rtol=0,
            atol=TOLERANCE,
            err_msg=f"{what} {k}",
        )


def model_arrays(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


# --- memory ≡ MQTT, and declared bytes = sent bytes
# ------------------------------------------------


@pytest.fixture(scope="module")
def broker():
    b = EmbeddedBroker(port=0).start()
    yield b
    b.stop()


def mqtt_fleet(cfg, broker, fleet: str, monkeypatch, runtime=DeviceRuntime):
    """The devices of ``cfg`` as DeviceRuntime threads (their local work serialised: torch's
    generator is process-wide) and a function that serves the run and joins them."""
    lock = threading.RLock()
    build, handle = device_module.build_assigned, agent_module.DeviceAgent.handle_bytes

    def locked_build(*a, **k):
        with lock:
            return build(*a, **k)

    def locked_handle(self, data):
        with lock:
            return handle(self, data)

    monkeypatch.setattr(device_module, "build_assigned", locked_build)
    monkeypatch.setattr(agent_module.DeviceAgent, "handle_bytes", locked_handle)
    run = assemble(cfg)
    runtimes = [
        runtime(
            DeviceOptions(
                broker=broker.url,
                device_id=d,
                fleet=fleet,
                data=DataSpec.from_config(cfg, i).to_string(),
                tier=run.specs[d].tier,
                profile=dict(SIMULATED_PROFILE),
                register_every=0.5,
            )
        )
        for i, d in enumerate(run.ids)
    ]

    def serve_run(**kwargs):
        threads = [
            threading.Thread(target=r.run, kwargs={"stop_after": scaled(240)}, daemon=True)
            for r in runtimes
        ]
        for t in threads:
            t.start()
        try:
            return serve(
                cfg.model_copy(update={"min_devices": len(run.ids)}),
                ServeOptions(
                    broker=broker.url,
                    fleet=fleet,
                    deadline=scaled(120),
                    wait_for_devices=scaled(120),
                ),
                **kwargs,
            )
        finally:
            for t in threads:
                t.join(scaled(60))
            assert not any(t.is_alive() for t in threads), (
                "a device did not leave when the run was over"
            )

    return run, runtimes, serve_run


def memory_run(cfg):
    """The in-memory run: (server state, {device: model arrays}, summary)."""
    box = {}
    summary = simulate(cfg, on_done=lambda s: box.__setitem__("state", s.state_dict()))
    run = assemble(cfg)  # the device models it saved, read back
    from edgefl.export.checkpoint import load_device_model

    models = {d: model_arrays(load_device_model(summary["run_dir"], d)) for d in run.ids}
    return box["state"], models, summary


def server_opt_cases() -> list:
    """The server optimizers (issue 39): every one on FedAvg, and FedAdam on every other method
    whose declaration says its server averages weights (Felo/Velo with two devices of one
    architecture, so that an average exists to step)."""
    from edgefl.algorithms import get_algorithm

    def averages(name: str) -> bool:
        algorithm = get_algorithm(name)
        return algorithm.needs_for(algorithm.parse_options({})).averages_weights

    same_arch = {"felo": {"tiers": ("10", "14")}, "velo": {"tiers": ("10", "14")}}
    out = [
        pytest.param("fedavg", {"server_opt": o}, id=f"fedavg-{o}")
        for o in ("fedavgm", "fedadagrad", "fedyogi", "fedadam")
    ]
    out += [
        pytest.param(m, {"server_opt": "fedadam", **same_arch.get(m, {})}, id=f"{m}-fedadam")
        for m in METHODS
        if m != "fedavg" and averages(m)
    ]
    return out


SERVER_OPT_CASES = server_opt_cases()

#: every method at its default model family, HierarchyFL's other tier family (width tiers), and
#: the server optimizers
CASES = (
    [pytest.param(m, {}, id=m) for m in METHODS]
    + [
        pytest.param(
            "hierarchyfl",
            {"model": "hierarchy-width", "tiers": ("1/8", "1/2", "1")},
            id="hierarchyfl-width",
        ),
    ]
    + SERVER_OPT_CASES
)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "family"), CASES)
def test_memory_and_mqtt_runs_agree(tmp_path, broker, monkeypatch, name, family):
    # Prepare: the in-memory reference; per-round evaluation off, so each round's transport
    # counters cover exactly the round's training exchange
    cfg = conformance_config(tmp_path, name, eval_every=0, **family)
    expected_state, expected_models, reference = memory_run(
        cfg.model_copy(update={"run_name": "memory"})
    )

    # the devices as threads, their local work serialised (torch's generator is process-wide)
    run, runtimes, serve_run = mqtt_fleet(
        cfg.model_copy(update={"run_name": "mqtt"}), broker, f"conf-{name}", monkeypatch
    )
    box: dict = {}

    # Execute: the server in this thread, the three devices in theirs (each must leave at the end)
    summary = serve_run(on_done=lambda s: box.__setitem__("state", s.state_dict()))

    # Assert: the same server state and device models
    assert_states_equal(box["state"], expected_state, "server state")
    for r in runtimes:
        assert_states_equal(
            model_arrays(r.agent.half.model),
            expected_models[r.opts.device_id],
            f"model of {r.opts.device_id}",
        )
    assert summary["client_accuracy"] == pytest.approx(reference["client_accuracy"], abs=TOLERANCE)
    # every device took its final downlink
    assert summary["finish_failed"] == reference["finish_failed"] == {}

    # and the bytes the round records declare are what the transport carried
    rounds = [
        json.loads(line)
        for line in (Path(summary["run_dir"]) / "rounds.jsonl").read_text().splitlines()
    ]
    assert [r["completed"] for r in rounds] == [run.ids] * len(rounds)
    for r in rounds:
        sent = r["transport"]
        for d in r["selected"]:
            assert sent["published_down"][d] == r["bytes_down"][d] * (
                1 + sent["retries"].get(d, 0)
            ), (r["round"], d)
            assert sent["received_up"][d] >= r["bytes_up"][d] > 0
        assert sum(sent["received_up"].values()) >= r["bytes_up_total"]
        # no re-sent request, no duplicate reply: exactly
        if not sent["dropped"] and not sent["retries"]:
            assert sum(sent["received_up"].values()) == r["bytes_up_total"]  # what was declared


# --- checkpoint → resume --------------------------------------------------------------------------


class Interrupted(Exception):
    pass


def memory_fleet(cfg):
    """The simulation's parties, by the run assembly, with the in-memory transport."""
    run = assemble(cfg)
    transport = InMemoryTransport()
    halves, fleet = {}, {}
    for d in run.ids:
        halves[d] = run.device_half(d)
        transport.connect(
            d, DeviceAgent(halves[d], eval_sets=run.data.evals, algorithm=cfg.algorithm).handle
        )
        fleet[d] = DeviceRecord(run.specs[d], len(halves[d].ctx.train_data))
    return run, transport, halves, fleet


def run_loop(cfg, checkpoint_dir=None, stop_after_round=None):
    run, transport, halves, fleet = memory_fleet(cfg)
    settings = LoopSettings(
        rounds=cfg.rounds, algorithm=cfg.algorithm, eval_every=0, checkpoint_dir=checkpoint_dir
    )

    def new_loop(on_round):
        ctx = run.server_context(fleet)
        return RoundLoop(
            run.algorithm.server(ctx, run.options), ctx, transport, settings, on_round=on_round
        )

    def interrupt(record):
        if record["round"] == stop_after_round:
            raise Interrupted

    loop = new_loop(interrupt)
    if stop_after_round is not None:
        with pytest.raises(Interrupted):
            loop.run()
        loop = new_loop(lambda record: None)  # a new server, the same devices (they kept running)
        assert loop.start_round == stop_after_round  # rounds completed; records count from 1
    final = loop.run()
    return loop.server.state_dict(), {d: model_arrays(h.model) for d, h in halves.items()}, final


@pytest.mark.parametrize(
    ("name", "extra"), [pytest.param(m, {}, id=m) for m in METHODS] + SERVER_OPT_CASES
)
def test_checkpoint_then_resume_ends_where_an_uninterrupted_run_ends(tmp_path, name, extra):
    cfg = conformance_config(tmp_path, name, **extra)
    # Execute
    expected_state, expected_models, expected = run_loop(cfg)
    state, models, final = run_loop(cfg, checkpoint_dir=tmp_path / "ck", stop_after_round=1)
    # Assert
    # the optimizer stepped, and its moments are server state that resumes
    if "server_opt" in extra:
        assert any(k.startswith("opt|") for k in expected_state), sorted(expected_state)[:5]
    assert_states_equal(state, expected_state, "server state")
    for d in expected_models:
        assert_states_equal(models[d], expected_models[d], f"model of {d}")
    assert final["client_accuracy"] == pytest.approx(expected["client_accuracy"], abs=TOLERANCE)
    # every device took its final downlink
    assert final["finish_failed"] == expected["finish_failed"] == {}


# --- malformed messages
# -----------------------------------------------------------------------------


@functools.cache
def parties(name: str):
    """One in-memory fleet per method for the malformed-message checks (they only add requests)."""
    # nothing is written
    cfg = conformance_config(Path(tempfile.gettempdir()) / "edgefl-conformance-unused", name)
    return cfg, *memory_fleet(cfg)


def new_loop(name: str, transport=None) -> RoundLoop:
    """A new server for the method's fleet, over ``transport`` (default: the fleet's own)."""
    cfg, run, own, halves, fleet = parties(name)
    ctx = run.server_context(fleet)
    settings = LoopSettings(rounds=cfg.rounds, algorithm=cfg.algorithm, eval_every=0)
    return RoundLoop(run.algorithm.server(ctx, run.options), ctx, transport or own, settings)


@functools.cache
def round_zero(name: str) -> tuple[Envelope, dict[str, Envelope]]:
    """Round 0 run once per method: d00's train request of round 1, after it (everything a method
    sends once the server holds state, such as FedProto's prototypes, FedVTC's σ and FedHeNN's
    kernel, is in it), and every device's real reply of round 0."""
    cfg, run, transport, *_ = parties(name)
    replies: dict[str, Envelope] = {}
    handlers = dict(transport.handlers)

    def recording(d: str):
        def handle(request: Envelope) -> Envelope:
            replies[d] = handlers[d](request)
            return replies[d]

        return handle

    loop = new_loop(name)
    for d in run.ids:
        transport.connect(d, recording(d))
    try:
        loop.run_round(0)
    finally:
        for d in run.ids:
            transport.connect(d, handlers[d])
    loop.ctx.round = 1
    d = run.ids[0]
    request = Envelope(
        "train",
        1,
        d,
        algorithm=cfg.algorithm,
        tier=run.specs[d].tier,
        payload=loop.server.downlink(1, d),
    )
    return request, replies


def declared(name: str, direction: str) -> dict:
    """The arrays the method declares for d00's downlinks ("down") or uplinks ("up")."""
    _, run, _, halves, fleet = parties(name)
    d = run.ids[0]
    if direction == "down":
        specs = halves[d].expected_downlink()
    else:
        specs = run.algorithm.server(run.server_context(fleet), run.options).expected_uplink(d)
    return None if specs is None else dict(specs)


HOW = ["wrong shape", "wrong dtype", "NaN", "missing key", "undeclared array", "wrong algorithm"]


def cases(name: str, direction: str) -> list:
    """The ways to spoil the method's messages that its declaration makes possible: every way
    for a method whose messages carry arrays (NaN where one is a float array); a wrong algorithm
    and an undeclared array for one whose messages carry none (Local). A method that declares
    nothing (None) is given every case, and fails those its receiver does not catch."""
    specs = declared(name, direction)
    applies = {"wrong algorithm", "undeclared array"}
    if specs is None or specs:
        applies |= {"wrong shape", "wrong dtype", "missing key"}
    if specs is None or any(np.dtype(s.dtype).kind == "f" for s in specs.values()):
        applies.add("NaN")
    return [pytest.param(name, how, id=f"{name}-{how}") for how in HOW if how in applies]


def spoiled_array(payload: Payload, how: str) -> str:
    """The array ``how`` spoils: the first float array by name (else integer), as declared."""
    kinds = "f" if how == "NaN" else "fui"
    for kind in kinds:
        names = sorted(k for k, v in payload.arrays.items() if v.dtype.kind == kind and v.size > 0)
        if names:
            return names[0]
    raise AssertionError(
        f"the message carries no array to spoil with {how} ({sorted(payload.arrays)}), though the "
        "method declares some"
    )


def malformed(envelope: Envelope, how: str) -> Envelope:
    """``envelope`` spoiled one way."""
    if how == "wrong algorithm":
        return dataclasses.replace(envelope, algorithm="not-" + (envelope.algorithm or "x"))
    arrays = dict(envelope.payload.arrays)
    if how == "undeclared array":
        arrays["undeclared"] = np.zeros(1, np.float32)
    else:
        name = spoiled_array(envelope.payload, how)
        a = np.asarray(arrays[name])
        if how == "wrong shape":
            arrays[name] = np.concatenate([a.reshape(-1), a.reshape(-1)[:1]])
        elif how == "wrong dtype":
            arrays[name] = a.astype(np.float64 if a.dtype != np.float64 else np.float32)
        elif how == "NaN":
            arrays[name] = a.copy()
            arrays[name].reshape(-1)[0] = np.nan
        elif how == "missing key":
            del arrays[name]
    return dataclasses.replace(envelope, payload=Payload(arrays, dict(envelope.payload.meta)))


def is_wire_rejection(reason: str) -> bool:
    """The one error type for a message that fails validation: WireError (the agent and the loop
    report it as 'rejected: …')."""
    return reason.startswith("rejected: ") or reason.startswith("WireError: ")


@pytest.mark.parametrize(("name", "how"), [c for n in METHODS for c in cases(n, "down")])
def test_a_malformed_downlink_is_rejected_and_the_device_keeps_serving(name, how):
    # Prepare: a device and the server's real downlink of round 1, spoiled one way
    cfg, run, transport, halves, fleet = parties(name)
    good, _ = round_zero(name)
    agent = DeviceAgent(halves[good.device_id], eval_sets=run.data.evals, algorithm=cfg.algorithm)
    bad = encode(malformed(good, how))
    # Execute
    reply = decode(agent.handle_bytes(bad))
    after = decode(
        agent.handle_bytes(encode(dataclasses.replace(good, message_id=uuid.uuid4().hex)))
    )
    # Assert: refused as a WireError, then the good request served
    assert reply.kind == "error", f"{name} accepted a downlink with {how}"
    assert is_wire_rejection(str(reply.payload.meta["reason"])), reply.payload.meta["reason"]
    assert after.kind == "update", after.payload.meta.get("reason")


@pytest.mark.parametrize(("name", "how"), [c for n in METHODS for c in cases(n, "up")])
def test_a_malformed_uplink_is_rejected_and_the_round_goes_on(name, how):
    # Prepare: a new server's round 0, every device answering with its real reply of round 0
    # (recorded once: the server's checks, not local training, are under test); d00's spoiled
    cfg, run, transport, *_ = parties(name)
    _, replies = round_zero(name)

    def answer(request: Envelope) -> Envelope:
        reply = dataclasses.replace(
            replies[request.device_id], run=request.run, nonce=request.nonce
        )
        return malformed(reply, how) if request.device_id == run.ids[0] else reply

    loop = new_loop(name, InMemoryTransport(dict.fromkeys(run.ids, answer)))
    # Execute
    record = loop.run_round(0)
    # Assert: d00 rejected as malformed, the others aggregated
    d = run.ids[0]
    assert d in record["failed"], f"the server accepted an uplink with {how}"
    assert record["failed"][d].startswith("rejected: "), record["failed"][d]
    assert record["completed"] == run.ids[1:]


# --- export
# ------------------------------------------------------------------------------------------


def default_specs():
    """Every distinct model of every method's default fleet (tiny widths)."""
    specs = {}
    for name in METHODS:
        cfg = tiny_config(Path("unused"), algorithm=name)
        from edgefl.data import dataset_info
        from edgefl.runtime.setup import fleet_specs, run_tiers

        tiers = run_tiers(cfg)
        for spec in fleet_specs(
            cfg.model_copy(update={"tiers": tuple(tiers)}),
            [f"t{i}" for i in range(len(tiers))],
            dataset_info("synthetic"),
        ).values():
            specs.setdefault(spec, []).append(name)
    return specs


SPECS = default_specs()


@pytest.mark.slow
@pytest.mark.parametrize(
    "spec", list(SPECS), ids=[f"{s.name}-{'+'.join(m)}" for s, m in SPECS.items()]
)
def test_every_tier_exports_to_onnx(tmp_path, spec):
    from edgefl.export.onnx_export import export_model
    from edgefl.models import build_model

    torch.manual_seed(0)
    model = build_model(spec).eval()
    images = (torch.rand(8, *spec.in_shape) * 255).to(torch.uint8)
    try:
        report = export_model(
            model, tmp_path / "m.onnx", parity_images=images, calibration_images=images
        )
    except EdgeflError as e:
        pytest.fail(f"{spec.name}: {e}")
    assert (tmp_path / "m.onnx").stat().st_size > 0
    from edgefl.export.onnx_export import DEFAULT_TOLERANCE

    # the exporter's documented rule: tolerance × max(1, max |logit|) (random images give large
    # logits)
    with torch.no_grad():
        scale = max(1.0, float(model(images.float()).abs().max()))
    assert report.max_abs_diff <= DEFAULT_TOLERANCE * scale


# --- privacy: what each method's uplink reveals
# ----------------------------------------------------


def private_config(tmp_path: Path, name: str, clip: float = 1.0):
    """The conformance run with local differential privacy (ε = 8, δ = 1e-5, clip ``clip``)."""
    dp = {"dp": "local", "dp_target_epsilon": "8", "dp_delta": "1e-5", "dp_clip": str(clip)}
    return conformance_config(tmp_path, name, options=dp)


def release_of(name: str):
    _, run, *_ = parties(name)
    return run.algorithm.device.privacy_release(run.options)


PROTECTABLE = [m for m in METHODS if release_of(m) is not None and not release_of(m).unprotected]
WITH_STATISTICS = [m for m in PROTECTABLE if release_of(m).stats is not None]


@pytest.mark.parametrize("name", METHODS)
def test_every_method_declares_every_array_its_uplink_carries(name):
    # Prepare: the method's declaration and its devices' real uplinks of round 0
    release = release_of(name)
    _, replies = round_zero(name)
    # Assert: a declaration, naming every array sent; what it cannot protect, dp refuses by name
    assert release is not None, f"{name} does not declare what its uplink reveals"
    for d, reply in replies.items():
        assert [k for k in reply.payload.arrays if not release.declares(k)] == [], d
    if release.unprotected:
        from edgefl.errors import ConfigError
        from edgefl.runtime.setup import resolve_method

        with pytest.raises(ConfigError, match=release.unprotected[0]):
            resolve_method(
                name, {**SMALL_WORK.get(name, {}), "dp": "local", "dp_target_epsilon": "8"}
            )


@pytest.mark.parametrize("name", PROTECTABLE)
def test_a_private_round_passes_the_servers_checks_and_records_epsilon(tmp_path, name):
    # Prepare: the method's fleet with local DP (the devices' halves wrapped by the run assembly)
    from edgefl.runtime.setup import build_server

    cfg = private_config(tmp_path, name)
    run, transport, halves, fleet = memory_fleet(cfg)
    ctx = run.server_context(fleet)
    loop = RoundLoop(
        build_server(run.method, ctx),
        ctx,
        transport,
        LoopSettings(rounds=cfg.rounds, algorithm=cfg.algorithm, eval_every=0),
    )
    # Execute
    record = loop.run_round(0)
    # Assert: every protected uplink passed the method's own uplink checks; ε spent per device,
    # within the budget; what was computed on private data is not sent
    assert record["completed"] == run.ids, record["failed"]
    eps = record["privacy"]["epsilon"]
    if release_of(name).parts:
        assert all(0 < eps[d] <= 8.0 for d in run.ids), eps
    else:  # nothing leaves the device (Local): nothing spent
        assert all(eps[d] == 0 for d in run.ids), eps
    assert all(
        set(m) <= {"dp_epsilon", "train_seconds"} for m in record["device_metrics"].values()
    ), record["device_metrics"]
    assert record["train_loss"] == {}


@pytest.mark.parametrize("name", WITH_STATISTICS)
def test_one_adversarial_sample_moves_the_statistics_by_at_most_the_declared_sensitivity(name):
    # Prepare: a device's data, and a neighbour where one sample is replaced by an extreme image
    # of another class (its features and logits far beyond any clip)
    from edgefl.data import ArrayDataset
    from edgefl.privacy import SENSITIVITY
    from edgefl.privacy.mechanisms import class_sums

    _, run, _, halves, _ = parties(name)
    half = halves[run.ids[0]]
    release, clip = release_of(name), 0.1  # below any softmax vector's norm (≥ 1/√C)
    data = half.ctx.train_data
    x, y = data.x.clone(), data.y.clone()
    x[0] = 255 - x[0]
    x[0, ..., : x.shape[-1] // 2] = 255
    y[0] = (int(y[0]) + 1) % half.ctx.num_classes
    neighbour = ArrayDataset(x, y, data.info)
    # Execute
    sums, counts = class_sums(
        half.sample_vectors, half.model, data, release.stats, half.ctx.num_classes, clip
    )
    sums2, counts2 = class_sums(
        half.sample_vectors, half.model, neighbour, release.stats, half.ctx.num_classes, clip
    )
    # Assert: the sums (over every block) and the counts, scaled by the clip, move by at most the
    # declared sensitivity; the unclipped vectors of the sample do exceed the clip
    moved = sum(float(np.sum((sums[b] - sums2[b]) ** 2)) for b in release.stats.blocks) / clip**2
    moved += float(np.sum((counts - counts2) ** 2))
    assert moved**0.5 <= SENSITIVITY * (1 + 1e-9)
    with torch.no_grad():
        half.model.eval()
        first, _ = next(iter(neighbour.batches(1, shuffle=False)))
        raw = half.sample_vectors(first)
    assert sum(float(v.double().pow(2).sum()) for v in raw.values()) ** 0.5 > clip
