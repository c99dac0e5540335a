"""Secure aggregation (edgefl/privacy/secagg*.py, runtime/secure.py), in memory.

- the protocol: the sum is exact (to the fixed point's precision) with 0 and with 1 of 5 devices
  dropping out after sharing; the server's whole view does not give back any device's update
  (attempts to reconstruct one fail); a device asked for both kinds of share for a peer refuses;
  a lie (a wrong share, a masked input that does not match its masks, a relayed share altered)
  is caught: the liar is named and the sum still exact, or the round fails loudly;
- FedAvg with ``secagg=on`` in the round loop: the same global model as without it (to the
  fixed point's precision), with and without a device that drops after sharing; a round that
  cannot finish fails loudly; central DP and robust defences combine as documented.
"""

import json
import logging

import numpy as np
import pytest

from edgefl.errors import ConfigError, EdgeflError
from edgefl.privacy.secagg import CANARIES, DeviceRound, SecAggSettings, decode
from edgefl.privacy.secagg_crypto import (
    KEY_BYTES,
    SecAggError,
    combine,
    commitment,
    derive,
    lagrange_weights,
    prg,
    share_value,
    to_secret,
)
from edgefl.privacy.secagg_server import ServerRound
from tests.conftest import tiny_config

SETTINGS = SecAggSettings(on=True)
CONTEXT = "run0|0"


def share_keys(device, server, t):
    """What ``device`` seals for its neighbours, from what the server announces to it."""
    hood = server.neighbourhood(device.me)
    return device.share(list(server.roster), hood, t, server.k, server.seed)


def after_sharing(ids, settings=SETTINGS):
    """Devices ``ids`` and a server through advertising and sharing keys: (devices, server, the
    sealed shares the server relayed to each device)."""
    devices = {d: DeviceRound(d, CONTEXT, settings) for d in ids}
    server = ServerRound(CONTEXT, settings)
    t = server.set_roster({d: v.advert for d, v in devices.items()})
    return devices, server, server.relay({d: share_keys(v, server, t) for d, v in devices.items()})


def protocol(updates, weights, *, drop=(), settings=SETTINGS, liar=None, unmask_from=None):
    """One round between the server and devices with ``updates``; the devices in ``drop`` leave
    after sharing. Returns (the server's sum, the server, the devices, the server's view)."""
    ids = sorted(updates)
    devices = {d: DeviceRound(d, CONTEXT, settings) for d in ids}
    server = ServerRound(CONTEXT, settings)
    view = {"adverts": {d: devices[d].advert for d in ids}}
    t = server.set_roster(view["adverts"])
    view["sealed"] = {d: share_keys(devices[d], server, t) for d in ids}
    inbox = server.relay(view["sealed"])
    view["masked"] = {
        d: devices[d].masked_input(inbox[d], updates[d], weights[d])[0]
        for d in ids
        if d not in drop
    }
    survivors = server.add_masked(view["masked"])
    holders = unmask_from or survivors
    view["shares"] = {d: devices[d].unmask(server.alive_for(d)) for d in holders}
    if liar is not None:
        seeds, keys = view["shares"][liar]
        view["shares"][liar] = ([bytes(66 - 1) + b"\x07"] * len(seeds), list(keys))
    return server.unmask(view["shares"]), server, devices, view


@pytest.fixture
def five():
    rng = np.random.default_rng(0)
    updates = {f"d{i}": rng.normal(0, 0.05, 2000) for i in range(5)}
    sizes = {"d0": 10, "d1": 50, "d2": 20, "d3": 30, "d4": 40}
    weights = {d: n / sum(sizes.values()) for d, n in sizes.items()}
    return updates, weights


# --- the protocol ---------------------------------------------------------------------------------


@pytest.mark.parametrize("drop", [(), ("d2",)])
def test_the_sum_is_exact_with_no_device_and_with_one_of_five_dropping_after_sharing(five, drop):
    updates, weights = five
    total, server, _, _ = protocol(updates, weights, drop=drop)
    survivors = [d for d in updates if d not in drop]
    want = sum(weights[d] * updates[d] for d in survivors)
    assert server.survivors == survivors and server.dropped == list(drop) and server.threshold == 3
    # each device rounds to a multiple of clip / 2^29: at most half of that per device
    assert np.abs(total - want).max() <= len(survivors) * 0.5 * SETTINGS.clip / 2**29
    assert server.liars == {}


def test_too_many_dropouts_fail_loudly(five):
    updates, weights = five
    with pytest.raises(SecAggError, match="threshold is 3"):
        protocol(updates, weights, drop=("d1", "d2", "d3"))


def test_the_servers_view_does_not_give_back_any_devices_update(five):
    updates, weights = five
    total, server, devices, view = protocol(updates, weights, drop=("d2",))
    points = {d: i + 1 for i, d in enumerate(sorted(updates))}
    n = len(updates["d0"]) + CANARIES
    # Every seed and key share the server holds, by owner: seeds of survivors, keys of d2 only.
    seed_owners = set(server.survivors)
    key_owners = set(server.dropped)
    assert seed_owners.isdisjoint(key_owners)
    for d in server.survivors:
        # Attempt 1: the server removes d's self mask (it learns d's seed) ...
        seed_shares = {
            points[h]: share_value(s[0][server.survivors.index(d)])
            for h, s in view["shares"].items()
        }
        seed = to_secret(
            combine(
                lagrange_weights(sorted(seed_shares)[:3]),
                [seed_shares[x] for x in sorted(seed_shares)[:3]],
            )
        )
        assert commitment(seed, CONTEXT) == view["adverts"][d][2 * KEY_BYTES :]
        rest = view["masked"][d] - prg(derive(seed, "self-mask", CONTEXT), n)
        # ... and is left with the update under the pairwise masks, which look uniform: decoding
        # it fails, and it is no closer to the update than a uniform draw is
        with pytest.raises(SecAggError):
            decode(rest, 1, SETTINGS)
        signed = rest.view(np.int32).astype(np.float64)[:-CANARIES] / SETTINGS.scale
        assert abs(np.corrcoef(signed, updates[d])[0, 1]) < 0.1
        # its top bits are uniform (χ² over 16 bins, 15 d.o.f.: 49.7 is the 1e-5 tail)
        counts = np.bincount(rest[:-CANARIES] >> 28, minlength=16)
        expected = len(rest[:-CANARIES]) / 16
        assert ((counts - expected) ** 2 / expected).sum() < 49.7
        # Attempt 2: its pairwise masks need d's mask key: the server holds no share of it
        assert d not in key_owners
    # Attempt 3: the sealed shares in transit are opaque to the server: it holds no channel key,
    # and fewer than t shares of a secret (here: the survivors' t-1 = 2) give another secret
    some = {points[h]: share_value(s[0][0]) for h, s in list(view["shares"].items())[:2]}
    guess = to_secret(combine(lagrange_weights(sorted(some)), [some[x] for x in sorted(some)]))
    assert (
        guess is None
        or commitment(guess, CONTEXT) != view["adverts"][server.survivors[0]][2 * KEY_BYTES :]
    )
    # What it does learn is the sum
    assert np.abs(total - sum(weights[d] * updates[d] for d in server.survivors)).max() < 1e-7


def test_a_masked_input_is_independent_of_the_update():
    # the same device, once with a large update and once with zeros: both uniform on the ring
    ids = ["a", "b", "c"]
    for scale in (0.0, 5.0):
        updates = {d: np.full(4000, scale) for d in ids}
        _, _, _, view = protocol(updates, dict.fromkeys(ids, 1 / 3))
        top = view["masked"]["a"][:-CANARIES] >> 28
        counts = np.bincount(top, minlength=16)
        expected = len(top) / 16
        assert ((counts - expected) ** 2 / expected).sum() < 49.7


def test_a_device_asked_for_both_shares_of_a_peer_refuses(five):
    updates, weights = five
    ids = sorted(updates)
    devices, server, inbox = after_sharing(ids)
    for d in ids:
        devices[d].masked_input(inbox[d], updates[d], weights[d])
    devices["d0"].unmask(ids)  # d1 survived: its seed share is revealed
    with pytest.raises(SecAggError, match="both the seed and the mask key of 'd1'"):
        devices["d0"].unmask([d for d in ids if d != "d1"])  # now d1 "dropped": its key share
    assert devices["d0"].unmask(ids)  # asking the same again is harmless (a retry)
    with pytest.raises(SecAggError, match="sent this device no shares"):
        devices["d0"].unmask([*ids, "mallory"])


def test_a_device_refuses_a_threshold_lower_than_the_settings_give():
    devices = {d: DeviceRound(d, CONTEXT, SETTINGS) for d in ("a", "b", "c", "d", "e")}
    server = ServerRound(CONTEXT, SETTINGS)
    server.set_roster({d: v.advert for d, v in devices.items()})
    with pytest.raises(SecAggError, match="threshold 2 \\(the settings give 4 and 3\\)"):
        share_keys(devices["a"], server, 2)
    assert set(share_keys(devices["b"], server, 3)) == {"a", "c", "d", "e"}


def test_a_liar_among_more_than_t_holders_is_named_and_the_sum_stays_exact(five):
    updates, weights = five
    total, server, _, _ = protocol(updates, weights, liar="d1")
    assert np.abs(total - sum(weights[d] * updates[d] for d in updates)).max() < 1e-7
    assert set(server.liars) == {"d1"}


def test_a_liar_among_exactly_t_holders_fails_the_round_loudly(five):
    updates, weights = five
    with pytest.raises(SecAggError, match="cannot remove .* mask: no subset"):
        protocol(updates, weights, liar="d1", unmask_from=["d0", "d1", "d2"])


def test_a_masked_input_that_does_not_match_its_masks_fails_loudly(five):
    updates, weights = five
    ids = sorted(updates)
    devices, server, inbox = after_sharing(ids)
    masked = {d: devices[d].masked_input(inbox[d], updates[d], weights[d])[0] for d in ids}
    # d3 masks with a seed other than the one it shared (or adds anything the masks do not explain)
    masked["d3"] = masked["d3"] + prg(b"\x01" * 32, len(masked["d3"]))
    server.add_masked(masked)
    with pytest.raises(SecAggError, match="still carries a mask"):
        server.unmask({d: devices[d].unmask(ids) for d in ids})


def test_an_altered_or_misrouted_share_is_refused_by_its_recipient(five):
    updates, weights = five
    ids = sorted(updates)
    devices, server, inbox = after_sharing(ids)
    altered = dict(inbox["d0"])
    box = bytearray(altered["d1"])
    box[20] ^= 1
    altered["d1"] = bytes(box)
    with pytest.raises(SecAggError, match="fail authentication"):
        devices["d0"].masked_input(altered, updates["d0"], weights["d0"])
    swapped = {
        **inbox["d4"],
        "d1": inbox["d4"]["d2"],
        "d2": inbox["d4"]["d1"],
    }  # relabelled senders
    with pytest.raises(SecAggError, match="fail authentication"):
        devices["d4"].masked_input(swapped, updates["d4"], weights["d4"])


def test_settings_are_checked():
    with pytest.raises(ConfigError, match="secagg_threshold"):
        SecAggSettings(on=True, threshold=0.3)
    with pytest.raises(ConfigError, match="secagg_clip"):
        SecAggSettings(on=True, clip=0)
    assert SecAggSettings(threshold=0.6).threshold_for(5) == 3
    assert SecAggSettings(threshold=0.6).threshold_for(2) == 2


# --- in the round loop (FedAvg, in memory) -------------------------------------------------


def one_round(tmp_path, options, drop=(), stage="mask", clients=5, **overrides):
    """Round 1 of a FedAvg run in memory; the devices in ``drop`` leave at ``stage`` (their
    request raises)."""
    from edgefl.algorithms.base import DeviceRecord
    from edgefl.runtime.agent import DeviceAgent
    from edgefl.runtime.exchange import LoopSettings
    from edgefl.runtime.loop import RoundLoop
    from edgefl.runtime.setup import assemble, build_server
    from edgefl.transport import InMemoryTransport

    cfg = tiny_config(tmp_path, clients=clients, rounds=1, options=options, **overrides)
    run = assemble(cfg)
    transport, samples = InMemoryTransport(), {}
    for d in run.ids:
        half = run.device_half(d)
        samples[d] = len(half.ctx.train_data)
        agent = DeviceAgent(half, algorithm=cfg.algorithm)

        def handler(env, agent=agent, d=d):
            if d in drop and env.payload.meta.get("secagg", "mask") == stage:
                raise ConnectionError("the device went away")
            return agent.handle(env)

        transport.connect(d, handler)
    fleet = {d: DeviceRecord(spec=run.specs[d], num_samples=samples[d]) for d in run.ids}
    ctx = run.server_context(fleet)
    server = build_server(run.method, ctx)
    loop = RoundLoop(
        server, ctx, transport, LoopSettings(rounds=1, algorithm=cfg.algorithm, eval_every=0)
    )
    record = loop.run_round(0)
    return record, {k: v for k, v in server.state_dict().items() if k.startswith("w/")}


@pytest.mark.parametrize("drop", [None, "d02"])
def test_fedavg_with_secagg_gives_the_same_model_as_without(tmp_path, drop):
    drops = (drop,) if drop else ()
    plain_record, plain = one_round(tmp_path / "plain", {}, drop=drops)
    record, secure = one_round(tmp_path / "secure", {"secagg": "on"}, drop=drops)
    assert set(plain) == set(secure)
    for k in plain:
        np.testing.assert_allclose(secure[k], plain[k], rtol=0, atol=1e-6, err_msg=k)
    survivors = [d for d in ("d00", "d01", "d02", "d03", "d04") if d != drop]
    assert record["completed"] == plain_record["completed"] == survivors
    info = record["secagg"]
    assert (info["advertised"], info["shared"], info["survivors"]) == (5, 5, len(survivors))
    assert (
        info["dropped"] == ([drop] if drop else [])
        and info["graph"] == "full"
        and info["threshold"] == 3
    )
    if drop:
        assert record["failed"][drop].startswith("secagg mask:")
    # the server's record of the round holds no device's loss (it stays on the device)
    assert record["train_loss"] == {}
    json.dumps(record)  # the round record is plain JSON


def test_a_round_that_cannot_finish_fails_loudly(tmp_path, caplog):
    # 3 devices, t = 2: two drop after sharing, one masked input is left (its sum is its update)
    with pytest.raises(EdgeflError, match="all 3 devices failed"):
        one_round(tmp_path, {"secagg": "on"}, drop=("d01", "d02"), clients=3)
    assert "secure aggregation failed: 1 masked inputs arrived; the threshold is 2" in caplog.text


def test_secagg_with_central_dp_gives_the_model_of_central_dp_without_it(tmp_path, caplog):
    from edgefl.privacy import secagg_halves

    secagg_halves._said.clear()
    caplog.set_level(logging.WARNING)
    dp = {"dp": "central", "dp_noise_multiplier": "0.5", "dp_clip": "0.05"}
    plain_record, plain = one_round(tmp_path / "plain", dp)
    record, secure = one_round(tmp_path / "secure", {"secagg": "on", **dp})
    # the devices clipped (the server could not), the server noised the unmasked average with the
    # same draw as when it clips and averages the raw updates itself
    for k in plain:
        np.testing.assert_allclose(secure[k], plain[k], rtol=0, atol=1e-6, err_msg=k)
    assert (
        record["secagg"]["survivors"] == 5
        and record["privacy"]["epsilon"] == plain_record["privacy"]["epsilon"]
    )
    assert "each device clips its own update to dp_clip=0.05" in caplog.text


def test_secagg_with_local_dp_masks_the_noised_update(tmp_path):
    options = {"dp": "local", "dp_noise_multiplier": "0.1", "dp_clip": "1"}
    plain_record, plain = one_round(tmp_path / "plain", options, clients=3)
    record, secure = one_round(tmp_path / "secure", {"secagg": "on", **options}, clients=3)
    for k in plain:  # the devices' noise is seeded per device and round: the same noised updates
        np.testing.assert_allclose(secure[k], plain[k], rtol=0, atol=1e-6, err_msg=k)
    assert record["secagg"]["survivors"] == 3
    assert (
        record["device_metrics"]["d00"]["dp_epsilon"]
        == plain_record["device_metrics"]["d00"]["dp_epsilon"]
        > 0
    )


def test_robust_defences_and_secagg(tmp_path, caplog):
    from edgefl.runtime.setup import resolve_method

    with pytest.raises(ConfigError, match="aggregator=median cannot apply with secure aggregation"):
        resolve_method("fedavg", {"secagg": "on", "aggregator": "median"})
    with pytest.raises(ConfigError, match="felo sends something else"):
        resolve_method("felo", {"secagg": "on"})
    with pytest.raises(ConfigError, match="dp_adaptive_quantile cannot apply"):
        resolve_method(
            "fedavg",
            {
                "secagg": "on",
                "dp": "central",
                "dp_noise_multiplier": "1",
                "dp_adaptive_quantile": "0.5",
            },
        )
    from edgefl.privacy import secagg_halves

    secagg_halves._said.clear()
    caplog.set_level(logging.WARNING)
    method = resolve_method("fedavg", {"secagg": "on", "clip_norm": "2"})
    assert method.secagg.on and method.options_dict()["secagg"] == "on"
    assert "clip_norm=2 is applied by each device to its own update" in caplog.text


def test_simulate_secagg_flag_runs_fedavg_with_secure_aggregation(tmp_path):
    from typer.testing import CliRunner

    from edgefl.cli.main import app

    args = ["simulate", "--algorithm", "fedavg", "--secagg", "--dataset", "synthetic",
            "--clients", "3", "--rounds", "1", "--steps", "2", "--train-samples", "600",
            "--test-samples", "100", "--eval-samples", "100", "--width", "0.25",
            "--out", str(tmp_path), "--run-name", "r"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (record,) = [
        json.loads(line) for line in (tmp_path / "r" / "rounds.jsonl").read_text().splitlines()
    ]
    assert record["secagg"]["survivors"] == 3 and record["completed"] == ["d00", "d01", "d02"]
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["resolved_options"]["secagg"] == "on"
    result = CliRunner().invoke(app, [*args[:3], "-o", "aggregator=median", *args[3:]])
    assert isinstance(result.exception, ConfigError)  # the entry point prints it and exits 3
    assert "cannot apply with secure aggregation" in str(result.exception)
