"""The conformance suite's checks of what a method sends and keeps (the runs themselves:
tests/test_conformance.py), for every registered method:

- a malformed downlink (wrong shape, wrong dtype, NaN, missing key, an undeclared array, wrong
  algorithm; a real downlink of round 1, so that what a method only sends once the server holds
  state is there to spoil) is rejected by the device as a ``WireError`` and the device keeps
  serving; a malformed uplink likewise on the server (the round goes on with the others). The
  cases a method gets follow its declared arrays (``expected_downlink``, ``expected_uplink``):
  a method whose messages carry no arrays (Local) gets the wrong algorithm and an undeclared array;
- every tier of the method's default fleet exports to ONNX (parity-checked; ``slow``);
- every array an uplink carries is declared, a private round passes the server's checks and
  records epsilon, and one adversarial sample moves the statistics by at most the declared
  sensitivity.
"""

from __future__ import annotations

import dataclasses
import functools
import tempfile
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

from edgefl.errors import EdgeflError
from edgefl.runtime.agent import DeviceAgent
from edgefl.runtime.exchange import LoopSettings
from edgefl.runtime.loop import RoundLoop
from edgefl.transport import InMemoryTransport
from edgefl.wire import Envelope, Payload, decode, encode
from tests.conformance_cases import (  # noqa: F401 (_restore_torch_threads: autouse)
    METHODS,
    _restore_torch_threads,
    conformance_config,
    memory_fleet,
)
from tests.conftest import SMALL_WORK, tiny_config


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
