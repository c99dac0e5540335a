"""SecAgg+'s neighbour graph (edgefl/privacy/secagg_graph.py) and the protocol on it, in memory.

- the graph: k-regular, symmetric, over exactly the roster, the same for the same seed; ``auto``
  keeps the full graph for small rounds and its k passes the bounds it is chosen by (and k - 2
  does not); honest survivors stay connected when random devices are removed;
- the protocol on a k-regular graph: each device agrees keys with and shares among its k
  neighbours only; the sum is exact with 0 and 1 of 5 dropping (k = 2) and with 0 and 2 of 20
  dropping (k = 6); the server's view gives back no device's update; a lie is named or fails the
  round loudly;
- a malformed or unexpected graph is refused by the devices (clear error), and in the round loop
  the round fails loudly; FedAvg on a graph gives the model of FedAvg without SecAgg.
"""

import math

import numpy as np
import pytest

from edgefl.errors import ConfigError, EdgeflError
from edgefl.privacy import secagg_graph as graph_mod
from edgefl.privacy.secagg import CANARIES, DeviceRound, SecAggSettings, decode
from edgefl.privacy.secagg_crypto import (
    KEY_BYTES,
    SecAggError,
    commitment,
    derive,
    prg,
    recover,
    share_value,
)
from edgefl.privacy.secagg_graph import auto_degree, check_graph, harary_graph, threshold_of
from edgefl.privacy.secagg_server import ServerRound
from tests.test_secagg import CONTEXT, one_round, protocol, share_keys

K2 = SecAggSettings(on=True, neighbours="2")
K6 = SecAggSettings(on=True, neighbours="6")


def ids_of(n):
    return [f"d{i:02d}" for i in range(n)]


def connected(graph, nodes):
    nodes = set(nodes)
    if not nodes:
        return True
    seen, todo = set(), [next(iter(nodes))]
    while todo:
        d = todo.pop()
        if d not in seen:
            seen.add(d)
            todo += [v for v in graph[d] if v in nodes and v not in seen]
    return seen == nodes


# --- the graph ------------------------------------------------------------------------------------


@pytest.mark.parametrize("n,k", [(5, 2), (20, 6), (101, 24), (12, 11)])
def test_the_graph_is_k_regular_symmetric_and_repeats_from_its_seed(n, k):
    ids, seed = ids_of(n), bytes(range(32))
    graph = harary_graph(ids, k, seed, CONTEXT)
    check_graph(graph, ids, k)  # raises unless regular, symmetric, over exactly ids
    assert all(len(v) == k and d not in v for d, v in graph.items())
    assert connected(graph, ids)
    assert harary_graph(list(reversed(ids)), k, seed, CONTEXT) == graph  # order does not matter
    if k == n - 1:
        assert graph == {d: set(ids) - {d} for d in ids}
    elif n >= 20:  # another seed (or round) gives another graph (at n = 5 there are only 12
        # rings: a collision is likely)
        assert harary_graph(ids, k, bytes(32), CONTEXT) != graph
        assert harary_graph(ids, k, seed, "run0|1") != graph


def test_auto_keeps_the_full_graph_for_small_rounds_and_takes_the_least_k_its_bounds_allow():
    auto = SecAggSettings(on=True)
    assert auto.neighbours_for(10) == 9 and auto.neighbours_for(49) == 48
    assert auto.threshold_for(10) == 6  # ⌈0.6·10⌉: the full graph's threshold, as before
    ks = {n: auto.neighbours_for(n) for n in (50, 100, 1000, 10_000)}
    assert all(k % 2 == 0 and 2 <= k < n - 1 for n, k in ks.items())
    assert ks[100] == 24 and ks[100] <= ks[1000] <= ks[10_000] <= 70  # O(log n)
    for n, k in ks.items():  # k passes the three tests, k - 2 fails one of them
        for degree, passes in ((k, True), (k - 2, False)):
            t = threshold_of(degree, 0.6)
            bad = math.floor(0.1 * n + 1e-9)
            ok = (
                graph_mod._log_disconnected(n, degree, 2 * bad) < -41 * math.log(2)
                and graph_mod._tail(n - 1, bad, degree, t) < 2.0**-41 / n
                and graph_mod._tail(n - 1, bad, degree, degree + 2 - t) < 2.0**-20 / n
            )
            assert ok == passes, (n, degree)
    assert auto_degree(100, 1.0) == 99  # no k < n - 1 survives dropouts with t = k + 1: full
    assert SecAggSettings(on=True, neighbours="full").neighbours_for(1000) == 999
    assert SecAggSettings(on=True, neighbours="6").neighbours_for(5) == 4  # at most n - 1


def test_honest_survivors_stay_connected_when_a_fifth_of_the_devices_are_removed():
    # the event auto's first bound makes rare (2^-41 by the union bound): at n = 100, k = 24,
    # not one of 300 random removals of 20 devices disconnects the rest
    ids, rng = ids_of(100), np.random.default_rng(0)
    for _ in range(300):
        graph = harary_graph(ids, 24, rng.bytes(32), CONTEXT)
        left = set(ids) - set(rng.choice(ids, 20, replace=False))
        assert connected(graph, left)


def test_neighbour_settings_are_checked():
    for bad in ("3", "0", "1", "many", "-2"):
        with pytest.raises(ConfigError, match="secagg_neighbours"):
            SecAggSettings(on=True, neighbours=bad)
    with pytest.raises(ConfigError, match="add secagg=on"):
        SecAggSettings(neighbours="4")
    assert SecAggSettings(on=True, neighbours=" 8 ").as_options()["secagg_neighbours"] == "8"


# --- the protocol on a graph -------------------------------------------------------------------


def fleet(n, seed=0):
    rng = np.random.default_rng(seed)
    updates = {d: rng.normal(0, 0.05, 1000) for d in ids_of(n)}
    sizes = {d: int(s) for d, s in zip(ids_of(n), rng.integers(10, 60, n), strict=True)}
    return updates, {d: s / sum(sizes.values()) for d, s in sizes.items()}


@pytest.mark.parametrize(
    "n,settings,drop",
    [(5, K2, ()), (5, K2, ("d02",)), (20, K6, ()), (20, K6, ("d03", "d11"))],
)
def test_the_sum_is_exact_on_a_graph_with_and_without_dropouts(n, settings, drop):
    updates, weights = fleet(n)
    total, server, devices, view = protocol(updates, weights, drop=drop, settings=settings)
    k = int(settings.neighbours)
    survivors = [d for d in updates if d not in drop]
    want = sum(weights[d] * updates[d] for d in survivors)
    assert server.k == k and not server.full and server.threshold == threshold_of(k, 0.6)
    assert server.survivors == survivors and server.dropped == sorted(drop)
    assert np.abs(total - want).max() <= n * 0.5 * settings.clip / 2**29
    # each device sealed shares for its k neighbours, masked with those that shared, and
    # unmasked only for its neighbourhood
    for d in updates:
        assert set(view["sealed"][d]) == server.graph[d] and len(view["sealed"][d]) == k
    for d in survivors:
        assert set(devices[d].peers) == server.graph[d]
        assert set(server.alive_for(d)) <= server.graph[d] | {d}


def test_the_servers_view_on_a_graph_gives_back_no_devices_update():
    updates, weights = fleet(20, seed=1)
    drop = ("d05", "d06")
    total, server, _, view = protocol(updates, weights, drop=drop, settings=K6)
    points = {d: i + 1 for i, d in enumerate(sorted(updates))}
    n = len(updates["d00"]) + CANARIES
    for v in server.survivors:
        # the server holds no share of a survivor's mask key: key shares name dropped devices only
        assert all(v not in server.dropped_for(h) for h in view["shares"])
        # it rebuilds v's seed (as the protocol lets it) and removes v's self mask ...
        holders = [h for h in view["shares"] if v in server.alive_for(h)]
        seeds = {
            points[h]: share_value(view["shares"][h][0][server.alive_for(h).index(v)])
            for h in holders
        }
        want = view["adverts"][v][2 * KEY_BYTES :]
        seed, _ = recover(seeds, server.threshold, lambda s, c=want: commitment(s, CONTEXT) == c)
        rest = view["masked"][v] - prg(derive(seed, "self-mask", CONTEXT), n)
        # ... and is left with the update under v's pairwise masks with its neighbours
        with pytest.raises(SecAggError):
            decode(rest, 1, K6)
        signed = rest.view(np.int32).astype(np.float64)[:-CANARIES] / K6.scale
        assert abs(np.corrcoef(signed, updates[v])[0, 1]) < 0.15
        # fewer than t of v's holders' shares (t - 1 of them) give no secret that fits
        few = dict(list(seeds.items())[: server.threshold - 1])
        with pytest.raises(SecAggError, match="no subset"):
            recover(few, len(few), lambda s, c=want: commitment(s, CONTEXT) == c, tries=1)
    assert np.abs(total - sum(weights[d] * updates[d] for d in server.survivors)).max() < 1e-7


def test_a_lie_on_a_graph_is_named_or_fails_the_round_loudly():
    updates, weights = fleet(20, seed=2)
    total, server, _, _ = protocol(updates, weights, settings=K6, liar="d07")
    assert set(server.liars) == {"d07"}  # 7 holders, t = 5: the other shares outvote it
    assert np.abs(total - sum(weights[d] * updates[d] for d in updates)).max() < 1e-7
    ids = ids_of(20)
    devices = {d: DeviceRound(d, CONTEXT, K6) for d in ids}
    server = ServerRound(CONTEXT, K6)
    t = server.set_roster({d: v.advert for d, v in devices.items()})
    inbox = server.relay({d: share_keys(devices[d], server, t) for d in ids})
    masked = {d: devices[d].masked_input(inbox[d], updates[d], weights[d])[0] for d in ids}
    masked["d04"] = masked["d04"] + prg(b"\x02" * 32, len(masked["d04"]))
    server.add_masked(masked)
    with pytest.raises(SecAggError, match="still carries a mask"):
        server.unmask({d: devices[d].unmask(server.alive_for(d)) for d in ids})


# --- a graph that is not the one promised --------------------------------------------------------


def announced(n=20, settings=K6):
    devices = {d: DeviceRound(d, CONTEXT, settings) for d in ids_of(n)}
    server = ServerRound(CONTEXT, settings)
    t = server.set_roster({d: v.advert for d, v in devices.items()})
    return devices, server, t


def test_a_device_refuses_a_malformed_or_unexpected_graph():
    devices, server, t = announced()
    me, ids = devices["d00"], list(server.roster)
    hood = server.neighbourhood("d00")
    with pytest.raises(SecAggError, match="with 4 neighbours .*settings give 6 and"):
        me.share(ids, hood, t, 4, server.seed)  # a smaller k than the settings give
    with pytest.raises(SecAggError, match="graph seed of 31 bytes"):
        me.share(ids, hood, t, server.k, server.seed[:31])
    # keys of a device that is not a neighbour in the seed's graph, in place of one that is
    outsider = sorted(set(ids) - server.graph["d00"] - {"d00"})[0]
    swapped = dict(hood)
    swapped.pop(sorted(server.graph["d00"])[0])
    swapped[outsider] = server.roster[outsider]
    with pytest.raises(SecAggError, match="not those of its neighbours in the graph"):
        me.share(ids, swapped, t, server.k, server.seed)
    with pytest.raises(SecAggError, match="repeats a device or leaves this one out"):
        me.share(ids[1:], hood, t, server.k, server.seed)
    assert me.stage == "advertised"  # none of it went through; the real announcement does
    assert set(me.share(ids, hood, t, server.k, server.seed)) == server.graph["d00"]
    # shares relayed from a device that is not a neighbour are refused too
    inbox = server.relay({d: share_keys(v, server, t) for d, v in devices.items() if d != "d00"})
    stranger = sorted(set(ids) - server.graph["d01"] - {"d00", "d01"})[0]
    forged = {**inbox["d01"], stranger: next(iter(inbox[stranger].values()))}
    with pytest.raises(SecAggError, match=f"{stranger!r}, which is not a neighbour of this"):
        devices["d01"].masked_input(forged, np.zeros(10), 0.05)


def ring():
    return {"a": {"b", "e"}, "b": {"a", "c"}, "c": {"b", "d"}, "d": {"c", "e"}, "e": {"d", "a"}}


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda g: g.update(a={"c", "e"}), "'a' lists 'c' .* not the other way round"),
        (lambda g: g.pop("e"), "differ"),
        (lambda g: g.update(a={"a", "b"}), "makes 'a' its own neighbour"),
        (lambda g: (g["a"].add("c"), g["c"].add("a")), "'a' has 3 neighbours, not 2"),
    ],
)
def test_check_graph_refuses_what_is_not_a_k_regular_graph_of_the_roster(change, match):
    ids = ["a", "b", "c", "d", "e"]
    graph = ring()
    check_graph(graph, ids, 2)  # the ring is a 2-regular graph of the five
    change(graph)
    with pytest.raises(SecAggError, match=match):
        check_graph(graph, ids, 2)
    for k in (3, 0, 5):  # odd below n - 1, too small, too large
        with pytest.raises(SecAggError, match="out of bounds"):
            check_graph(ring(), ids, k)


# --- in the round loop ---------------------------------------------------------------------


@pytest.mark.parametrize("drop", [None, "d02"])
def test_fedavg_on_a_neighbour_graph_gives_the_same_model_as_without_secagg(tmp_path, drop):
    drops = (drop,) if drop else ()
    _, plain = one_round(tmp_path / "plain", {}, drop=drops)
    options = {"secagg": "on", "secagg_neighbours": "2"}
    record, secure = one_round(tmp_path / "secure", options, drop=drops)
    for k in plain:
        np.testing.assert_allclose(secure[k], plain[k], rtol=0, atol=1e-6, err_msg=k)
    info = record["secagg"]
    assert (info["graph"], info["neighbours"], info["threshold"]) == ("k-regular", 2, 2)
    assert info["survivors"] == 5 - len(drops) and info["dropped"] == list(drops)


def test_a_server_that_announces_another_graph_fails_the_round_loudly(tmp_path, monkeypatch):
    # the server sends every device the keys of devices that are not its neighbours: each
    # device refuses at key sharing, and the round fails with every device's reason recorded
    real = ServerRound.neighbourhood

    def wrong(self, device):
        hood = real(self, device)
        others = sorted(set(self.roster) - set(hood))
        hood.pop(sorted(self.graph[device])[0])
        hood[others[0]] = self.roster[others[0]]
        return hood

    monkeypatch.setattr(ServerRound, "neighbourhood", wrong)
    with pytest.raises(EdgeflError, match="all 5 devices failed"):
        one_round(tmp_path, {"secagg": "on", "secagg_neighbours": "2"})


def test_the_neighbours_option_and_flag(tmp_path):
    from typer.testing import CliRunner

    from edgefl.cli.main import app
    from edgefl.runtime.setup import resolve_method

    method = resolve_method("fedavg", {"secagg": "on", "secagg_neighbours": "4"})
    assert method.secagg.neighbours == "4" and method.options_dict()["secagg_neighbours"] == "4"
    args = ["simulate", "--algorithm", "fedavg", "--secagg", "--secagg-neighbours", "3",
            "--dataset", "synthetic", "--clients", "5", "--rounds", "1",
            "--out", str(tmp_path)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert isinstance(result.exception, ConfigError)  # the entry point prints it and exits 3
    assert "secagg_neighbours='3'" in str(result.exception)
