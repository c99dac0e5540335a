"""The simulated clock against real links: the same three-device fleet in memory (the clock) and
over Mosquitto with each device in its own network namespace behind a shaped veth link.

Run as root (``ip netns``, ``tc``)::

    nice -n 10 python -m benchmarks.time_to_accuracy.links

Each device of ``links_fleet.yaml`` runs ``edgefl train`` in a namespace of its own; its veth pair
to the broker is shaped to its declared bandwidth each way (``tc``: netem with the declared
latency where the kernel has it, else a token bucket, tbf, with the rate only — and then the
fleet must declare no latency). ``--delay`` stands in for its modelled compute time (the clock's
training cost ÷ speed). The server (this process) and the broker talk over loopback.

Per device and round the check compares the clock's seconds for the device (in memory, and the
same model applied to the bytes the MQTT run counted) with what the MQTT server measured from
sending the model to the reply (``reply_seconds``) less the device's real training time on this
machine (``train_seconds``: the compute the clock models is emulated by ``--delay``, not by it).
Writes ``links.json`` and ``links.md`` here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import mean
from typing import Any

from benchmarks.common import machine

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
FLEET = HERE / "links_fleet.yaml"
TOLERANCE = 0.20


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
        "rounds": 2,
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
            if c.link.latency_ms and not self.netem:
                raise SystemExit(
                    f"{d} declares {c.link.latency_ms} ms of latency, but this kernel "
                    "has no netem (tc: unknown qdisc) to delay packets"
                )
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
            self.shape(host, c.link.down_mbps, c.link.latency_ms, None)  # to the device
            self.shape(dev, c.link.up_mbps, c.link.latency_ms, ns)  # from the device
        return self

    def __exit__(self, *exc: Any) -> None:
        for ns in self.ns.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def rounds_of(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "rounds.jsonl").read_text().splitlines()]


def main() -> dict[str, Any]:
    from edgefl.profiling import read_fleet
    from edgefl.profiling.measurement import estimate_round_seconds
    from edgefl.runtime.clock import FleetClock
    from edgefl.runtime.fleet import data_spec_for, device_command, start_device
    from edgefl.runtime.server import ServeOptions, serve
    from edgefl.runtime.setup import assemble, plan_fleet
    from edgefl.runtime.simulation import simulate
    from edgefl.transport.broker import MosquittoBroker

    if os.geteuid() != 0:
        raise SystemExit("run as root: the check creates network namespaces and shapes links")
    before = machine()
    fleet = read_fleet(FLEET)
    netem = has_netem()
    with tempfile.TemporaryDirectory(prefix="edgefl-links-") as tmp:
        out = Path(tmp)
        # the clock: the run in memory
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
        clock = FleetClock(fleet.conditions, compute, cfg.seed)
        # the same fleet over Mosquitto, each device behind its shaped link
        cfg = config(out, "mqtt")
        plan = plan_fleet(cfg, run.method)

        class Broker(MosquittoBroker):
            def config_text(self) -> str:
                extra = "".join(f"listener {self.port} {ip}\n" for ip in links.host_ip.values())
                return (
                    f"listener {self.port} 127.0.0.1\n{extra}"
                    + super().config_text().split("\n", 1)[1]
                )

        with Links(fleet.conditions, netem) as links:
            broker = Broker(workdir=out / "broker").start()
            procs = []
            try:
                for i, d in enumerate(plan.ids):
                    profile = out / f"{d}.json"
                    profile.write_text(json.dumps(profiles[d].to_dict()))
                    url = f"mqtt://{links.host_ip[d]}:{broker.port}"
                    cmd = device_command(
                        url,
                        "links",
                        d,
                        data_spec_for(cfg, i),
                        tier=plan.tiers[d],
                        profile_file=profile,
                        delay=round(compute[d], 3),
                        threads=1,
                    )
                    procs.append(
                        start_device(["ip", "netns", "exec", links.ns[d], *cmd], out / f"{d}.log")
                    )
                full = cfg.model_copy(update={"min_devices": cfg.clients})
                t0 = time.perf_counter()
                serve(
                    full,
                    ServeOptions(
                        broker=broker.url, fleet="links", deadline=600, wait_for_devices=300
                    ),
                )
                wall = time.perf_counter() - t0
            finally:
                for p in procs:
                    try:
                        p.wait(timeout=60)
                    except subprocess.TimeoutExpired:
                        p.terminate()
                broker.stop()
        mqtt = rounds_of(out / "mqtt")
    rows = []
    for rm, rq in zip(memory, mqtt, strict=True):
        for d in sorted(rq["reply_seconds"]):
            measured = rq["reply_seconds"][d] - rq["train_seconds"].get(d, 0.0)
            model = clock.duration(d, rq["bytes_down"][d], rq["bytes_up"][d])
            rows.append(
                {
                    "round": rq["round"],
                    "device": d,
                    "simulated": rm["clock"]["seconds"][d],
                    "model_on_mqtt_bytes": model,
                    "measured": measured,
                    "reply_seconds": rq["reply_seconds"][d],
                    "train_seconds": rq["train_seconds"].get(d),
                    "bytes_down": {"memory": rm["bytes_down"][d], "mqtt": rq["bytes_down"][d]},
                    "bytes_up": {"memory": rm["bytes_up"][d], "mqtt": rq["bytes_up"][d]},
                    "error": measured / rm["clock"]["seconds"][d] - 1.0,
                    # the links alone: what --delay (the modelled compute) does not stand in for
                    "link_model": model - compute[d],
                    "link_measured": measured - round(compute[d], 3),
                    "link_error": (measured - round(compute[d], 3)) / (model - compute[d]) - 1.0,
                }
            )
    result = {
        "check": "the simulated clock against shaped links over Mosquitto",
        "shaping": "netem (delay and rate)"
        if netem
        else "tbf (rate only: this kernel has no netem)",
        "fleet": str(FLEET.relative_to(ROOT)),
        "command": "nice -n 10 python -m benchmarks.time_to_accuracy.links",
        "machine": {"before": before, "after": machine()},
        "wall_seconds": wall,
        "compute_seconds": compute,
        "tolerance": TOLERANCE,
        "rows": rows,
        "max_abs_error": max(abs(r["error"]) for r in rows),
        "mean_abs_error": mean(abs(r["error"]) for r in rows),
        "max_abs_link_error": max(abs(r["link_error"]) for r in rows),
    }
    result["agrees"] = result["max_abs_error"] <= TOLERANCE
    (HERE / "links.json").write_text(json.dumps(result, indent=1) + "\n")
    (HERE / "links.md").write_text(page(result))
    print(page(result))
    return result


def page(r: dict[str, Any]) -> str:
    lines = [
        "# The simulated clock against shaped links (Mosquitto, one network namespace per device)",
        "",
        f"Fleet: `{r['fleet']}`; shaping: {r['shaping']}. Command: `{r['command']}` (as root). "
        f"Load (1/5/15 min): {r['machine']['before'].get('loadavg_1_5_15')} before, "
        f"{r['machine']['after'].get('loadavg_1_5_15')} after.",
        "",
        f"**{'Agrees' if r['agrees'] else 'Does not agree'}** within {100 * r['tolerance']:.0f} %: "
        f"largest error {100 * r['max_abs_error']:.1f} %, mean {100 * r['mean_abs_error']:.1f} % "
        "(measured = the MQTT server's send→reply seconds less the device's real training "
        "seconds; --delay emulates the modelled compute). The links alone (measured less the "
        "delay, against the modelled transfers): largest error "
        f"{100 * r['max_abs_link_error']:.1f} %. "
        "Not emulated here: churn (every device stays online) and latency (no netem in this "
        "kernel, so the fleet declares none).",
        "",
        "| round | device | simulated s | model on MQTT bytes s | measured s | reply s | train s "
        "| bytes down mem/MQTT | bytes up mem/MQTT | error | links: model s | links: measured s "
        "| links: error |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for x in r["rows"]:
        lines.append(
            f"| {x['round']} | {x['device']} | {x['simulated']:.2f} "
            f"| {x['model_on_mqtt_bytes']:.2f} "
            f"| {x['measured']:.2f} | {x['reply_seconds']:.2f} | {x['train_seconds'] or 0:.2f} "
            f"| {x['bytes_down']['memory']:,}/{x['bytes_down']['mqtt']:,} "
            f"| {x['bytes_up']['memory']:,}/{x['bytes_up']['mqtt']:,} | {100 * x['error']:+.1f} % "
            f"| {x['link_model']:.2f} | {x['link_measured']:.2f} | {100 * x['link_error']:+.1f} % |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
