"""The simulated clock against real links: the same three-device fleet on the fleet clock and
over Mosquitto with each device in its own network namespace behind a shaped veth link, with
latency and churn.

Run as root (``ip netns``, ``tc``)::

    nice -n 5 python -m benchmarks.time_to_accuracy.links

Each device of ``links_fleet.yaml`` runs ``edgefl train`` in a namespace of its own; its veth pair
to the host is shaped to its declared bandwidth each way (``tc``: tbf; netem where the kernel has
it, which this machine's has not). Between the host end of the veth and the broker on loopback a
user-space proxy per device (``linkproxy.py``) adds the declared one-way latency to each direction
and follows the device's availability timeline (the FleetClock's, same fleet file and seed): it
cuts the device's connections when the timeline turns offline (the broker publishes its Last
Will) and lets it reconnect when it is back. ``--delay`` stands in for the modelled compute (the
clock's training cost / speed). The server (this process) and the broker talk over loopback.

Round 1 is a warm-up outside the clock (every device online, the first training's one-off costs
paid); the timelines start when it ends, and the rounds after it are compared with the clock
(``linkcheck.py``). Writes ``links.json`` and ``links.md`` here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import machine

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
FLEET = HERE / "links_fleet.yaml"
TOLERANCE = 0.20
COMPARED_ROUNDS = 8  # after the warm-up round


def config(out: Path, name: str) -> Any:
    from edgefl.algorithms import get_algorithm
    from edgefl.config import resolve_config

    explicit = {
        "algorithm": "fedavg",
        "dataset": "fashion-mnist",
        "model": "cnn",
        "tiers": ("2",),
        "width": 0.5,
        "clients": 3,
        "fleet_file": str(FLEET),
        "partition": "iid",
        "rounds": 1 + COMPARED_ROUNDS,
        "epochs": 1,
        "optimizer": "sgd",
        "lr": 0.01,
        "momentum": 0.9,
        "batch_size": 32,
        "train_samples": 900,
        "test_samples": 300,
        "eval_samples": 300,
        "eval_every": 0,
        "out_dir": str(out),
        "run_name": name,
        "threads": 1,
    }
    return resolve_config(explicit, dict(get_algorithm("fedavg").defaults))


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def has_netem() -> bool:
    probe = f"fcp{os.getpid() % 100000}"
    sh("ip", "link", "add", probe, "type", "veth", "peer", "name", f"{probe}p")
    try:
        return (
            subprocess.run(
                ["tc", "qdisc", "add", "dev", probe, "root", "netem", "delay", "1ms"],
                capture_output=True,
            ).returncode
            == 0
        )
    finally:
        sh("ip", "link", "del", probe)


class Links:
    """A namespace per device, a veth pair to the host shaped both ways; removed on exit."""

    def __init__(self, conditions: dict[str, Any], netem: bool):
        self.conditions, self.netem = conditions, netem
        self.tag = f"{os.getpid() % 10000}"
        self.ns: dict[str, str] = {}
        self.host_ip: dict[str, str] = {}

    def shape(self, dev: str, mbps: float | None, latency_ms: float, ns: str | None) -> None:
        pre = ("ip", "netns", "exec", ns) if ns else ()
        if self.netem:
            rule = ["netem", "delay", f"{latency_ms}ms", "limit", "100000"]
            if mbps:
                rule += ["rate", f"{int(mbps * 1000)}kbit"]
        elif mbps:
            rule = ["tbf", "rate", f"{int(mbps * 1000)}kbit", "burst", "4kb", "latency", "10s"]
        else:
            return
        sh(*pre, "tc", "qdisc", "add", "dev", dev, "root", *rule)

    def __enter__(self) -> Links:
        for i, (d, c) in enumerate(sorted(self.conditions.items()), start=1):
            ns, host, dev = f"fcl{self.tag}d{i}", f"fch{self.tag}{i}", f"fcd{self.tag}{i}"
            sh("ip", "netns", "add", ns)
            self.ns[d] = ns
            sh("ip", "link", "add", host, "type", "veth", "peer", "name", dev)
            sh("ip", "link", "set", dev, "netns", ns)
            sh("ip", "addr", "add", f"10.78.{i}.1/24", "dev", host)
            sh("ip", "link", "set", host, "up")
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"10.78.{i}.2/24", "dev", dev)
            sh("ip", "netns", "exec", ns, "ip", "link", "set", dev, "up")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            self.host_ip[d] = f"10.78.{i}.1"
            # latency: netem's where the kernel has it, else the proxy's (linkproxy.py)
            self.shape(host, c.link.down_mbps, c.link.latency_ms, None)  # to the device
            self.shape(dev, c.link.up_mbps, c.link.latency_ms, ns)  # from the device
        return self

    def __exit__(self, *exc: Any) -> None:
        for ns in self.ns.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)



def rounds_of(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "rounds.jsonl").read_text().splitlines()]


def durations(memory: list[dict[str, Any]]) -> dict[str, float]:
    """Each device's seconds of local work per round as the in-memory run's clock charged them
    (the same every round: the same model down, the same update up)."""
    out: dict[str, float] = {}
    for rm in memory:
        for d, seconds in rm.get("clock", {}).get("seconds", {}).items():
            if abs(out.setdefault(d, seconds) - seconds) > 1e-6:
                raise SystemExit(f"{d}'s simulated seconds differ between rounds")
    return out


def timeline_of(timeline: Any) -> Any:
    """A proxy's view of one device's availability: t → (online, when that changes)."""

    def at(t: float) -> tuple[bool, float]:
        on = timeline.online(t)
        return on, timeline.online_until(t) if on else timeline.next_online(t)

    return at


def tcp_window() -> dict[str, int]:
    """What bounds a TCP sender here: the initial congestion window (10 segments, RFC 6928) and
    the receive buffer a connection starts with (net.ipv4.tcp_rmem's default)."""
    rmem = Path("/proc/sys/net/ipv4/tcp_rmem").read_text().split()
    return {"initial_cwnd_bytes": 10 * 1448, "rmem_default_bytes": int(rmem[1])}


def bdp(conditions: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Bandwidth-delay product per device and direction (bytes): rate × round trip (2 × the
    one-way latency), what a sender must have in flight to fill the link were the delay netem's."""
    out = {}
    for d, c in sorted(conditions.items()):
        rtt = 2 * c.link.latency_ms / 1e3
        out[d] = {
            "rtt_s": rtt,
            "down_bytes": (c.link.down_mbps or 0) * 1e6 / 8 * rtt,
            "up_bytes": (c.link.up_mbps or 0) * 1e6 / 8 * rtt,
        }
    return out


def wait_for(predicate: Any, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def main() -> dict[str, Any]:
    from benchmarks.time_to_accuracy.linkcheck import compare, page, verdict
    from benchmarks.time_to_accuracy.linkproxy import DelayProxy, Proxies
    from edgefl.profiling import read_fleet
    from edgefl.profiling.measurement import estimate_round_seconds
    from edgefl.runtime.clock import FleetClock
    from edgefl.runtime.fleet import data_spec_for, device_command, start_device
    from edgefl.runtime.server import ServeOptions, serve
    from edgefl.runtime.setup import assemble, plan_fleet
    from edgefl.runtime.simulation import simulate
    from edgefl.transport.broker import MosquittoBroker, free_port

    if os.geteuid() != 0:
        raise SystemExit("run as root: the check creates network namespaces and shapes links")
    before = machine()
    fleet = read_fleet(FLEET)
    netem = has_netem()
    with tempfile.TemporaryDirectory(prefix="edgefl-links-") as tmp:
        out = Path(tmp)
        # the clock: the run in memory (its per-device seconds)
        cfg = config(out, "memory")
        simulate(cfg, plots=False)
        memory = rounds_of(out / "memory")
        run = assemble(cfg)
        profiles = dict(fleet.devices)
        compute = {
            d: estimate_round_seconds(
                run.specs[d], profiles[d], run.settings.visits(len(run.data.parts[i]))
            )
            / fleet.conditions[d].speed
            for i, d in enumerate(run.ids)
        }
        duration = durations(memory)
        if set(duration) != set(run.ids):
            raise SystemExit(f"the in-memory run never charged {set(run.ids) - set(duration)}")
        clock = FleetClock(fleet.conditions, compute, cfg.seed)  # the check's
        timelines = FleetClock(fleet.conditions, compute, cfg.seed)  # the proxies' (their thread)
        # the same fleet over Mosquitto, each device behind its shaped link and its proxy
        cfg = config(out, "mqtt")
        plan = plan_fleet(cfg, run.method)
        port = free_port()
        marks: dict[str, Any] = {"t0": None, "start": {}, "end": {}, "wills": None}
        box: dict[str, Any] = {}
        with Links(fleet.conditions, netem) as links:
            broker = MosquittoBroker(workdir=out / "broker").start()
            proxies = Proxies([
                DelayProxy(
                    d,
                    (links.host_ip[d], port),
                    ("127.0.0.1", broker.port),
                    0.0 if netem else fleet.conditions[d].link.latency_ms / 1e3,
                    timeline_of(timelines.timelines[d]),
                )
                for d in plan.ids
            ])
            first_off = [d for d in plan.ids if not clock.online(d, 0.0)]

            def on_round(record: dict[str, Any]) -> None:
                now = time.monotonic()
                if marks["t0"] is None:  # the warm-up is over: the timelines start now
                    marks["t0"] = now
                    proxies.start(now)
                    status = box["transport"].status
                    # before the next round selects: the server has heard their Last Will
                    marks["wills"] = wait_for(
                        lambda: all(status.get(d) == "offline" for d in first_off), 30.0
                    )
                else:
                    marks["end"][record["round"]] = now - marks["t0"]

            def on_progress(stage: str, shown: Any, done: int, total: int, **_: Any) -> None:
                if stage == "train" and done == 0 and marks["t0"] is not None:
                    marks["start"].setdefault(shown, time.monotonic() - marks["t0"])

            procs = []
            try:
                with proxies:
                    for i, d in enumerate(plan.ids):
                        profile = out / f"{d}.json"
                        profile.write_text(json.dumps(profiles[d].to_dict()))
                        cmd = device_command(
                            f"mqtt://{links.host_ip[d]}:{port}",
                            "links",
                            d,
                            data_spec_for(cfg, i),
                            tier=plan.tiers[d],
                            profile_file=profile,
                            delay=round(compute[d], 3),
                            threads=1,
                        )
                        procs.append(start_device(
                            ["ip", "netns", "exec", links.ns[d], *cmd], out / f"{d}.log"
                        ))
                    full = cfg.model_copy(update={"min_devices": cfg.clients})
                    t0 = time.perf_counter()
                    serve(
                        full,
                        ServeOptions(
                            broker=broker.url, fleet="links", deadline=600, wait_for_devices=300
                        ),
                        on_round=on_round,
                        on_progress=on_progress,
                        on_started=lambda t: box.update(transport=t),
                    )
                    wall = time.perf_counter() - t0
                    events = proxies.events()
                    proxies.release()  # everyone back: the devices hear that the run is over
                    for p in procs:
                        try:
                            p.wait(timeout=60)
                        except subprocess.TimeoutExpired:
                            p.terminate()
            finally:
                for p in procs:
                    if p.poll() is None:
                        p.terminate()
                broker.stop()
        mqtt = rounds_of(out / "mqtt")
    comparison = compare(clock, list(plan.ids), duration, mqtt, marks["start"], marks["end"])
    result = {
        "check": "the simulated clock against shaped links with latency and churn over Mosquitto",
        "shaping": "netem (delay and rate)"
        if netem
        else "tbf (rate only: this kernel has no netem)",
        "latency": "netem's" if netem else "the proxy's (application level, linkproxy.py)",
        "churn": "the proxy cuts a device's connections while its timeline says offline",
        "fleet": str(FLEET.relative_to(ROOT)),
        "command": "nice -n 5 python -m benchmarks.time_to_accuracy.links",
        "machine": {"before": before, "after": machine()},
        "wall_seconds": wall,
        "compute_seconds": compute,
        "clock_seconds": duration,
        "warm_up_rounds": 1,
        "offline_at_start": first_off,
        "last_wills_heard_before_round_2": marks["wills"],
        "bdp": bdp(fleet.conditions),
        "tcp": tcp_window(),
        "tolerance": TOLERANCE,
        "proxy_events": events,
        "comparison": comparison,
        "verdict": verdict(comparison, TOLERANCE),
        "mqtt_rounds": [
            {k: r.get(k) for k in ("round", "selected", "completed", "failed", "reply_seconds",
                                   "train_seconds", "bytes_down", "bytes_up", "round_seconds")}
            for r in mqtt
        ],
    }
    result["agrees"] = result["verdict"]["agrees"]
    (HERE / "links.json").write_text(json.dumps(result, indent=1) + "\n")
    (HERE / "links.md").write_text(page(result))
    print(page(result))
    return result


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
