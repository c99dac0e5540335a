"""Orchestration overhead of edgefl over MQTT, side by side with Flower's simulation engine.

    nice -n 10 .venv/bin/python benchmarks/overhead/run.py            # the full benchmark
    nice -n 10 .venv/bin/python benchmarks/overhead/run.py --quick    # a smoke test (minutes)

Measured, in one run on this machine (with its load recorded before and after every section):

1. **Codec vs raw MQTT**: bytes/s of edgefl's envelope encode+decode of a ResNet-18-sized
   payload (11,173,962 float32 = 44.7 MB) vs a raw paho publish → subscriber delivery of the
   same bytes through each broker (QoS 1).
2. **edgefl over MQTT**: a server (this process, ``edgefl.runtime.server.serve``) and device
   processes (``device_main.py``, which runs ``run_device`` exactly as ``edgefl train`` does)
   through Mosquitto or the embedded amqtt broker, with the toy workload ``bench-echo``
   (devices echo the server's array: no local work; the server averages). Per round:
   overhead = round wall time − the slowest device's local work (``train_seconds``).
3. **edgefl in memory**: the same workload under ``edgefl simulate``'s in-memory transport.
4. **Flower**: the same 10-client numpy-only workload in Flower's simulation engine
   (``flower_toy.py``, ``flwr[simulation]`` in ``.venv-flower`` next to this file, created on
   first use). Ratio = Flower's overhead per round / edgefl's.

Round 1 includes warm-up (Flower starts its Ray actors then); steady state = median of rounds
2..R. Results: results.json, results.md and overhead.png next to this file.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import benchmarks.overhead.echo  # noqa: E402,F401  (registers bench-echo)
from benchmarks.common import (  # noqa: E402
    MemoryWatch,
    device_specs,
    machine,
    spawn_devices,
    stop_processes,
    write_json,
)
from benchmarks.overhead.echo import RESNET18_FLOATS  # noqa: E402

HERE = Path(__file__).resolve().parent
FLOWER_VENV = HERE / ".venv-flower"
TRIVIAL_FLOATS = 1000
log = logging.getLogger("overhead")


# --- helpers ---------------------------------------------------------------------------------


def steady(values: list[float]) -> float:
    """Median of rounds 2..R (round 1 carries warm-up)."""
    return statistics.median(values[1:] if len(values) > 1 else values)


def start_broker(kind: str, workdir: Path, nodelay: bool = False):
    from edgefl.transport.broker import EmbeddedBroker, MosquittoBroker

    if kind == "mosquitto":
        broker = MosquittoBroker(workdir=workdir / "mosquitto")
        if nodelay:
            from benchmarks.overhead.nodelay import mosquitto_nodelay

            mosquitto_nodelay(broker)
        return broker.start()
    return EmbeddedBroker(port=0).start()


# --- 1. codec vs raw paho ----------------------------------------------------------------------


def codec_throughput(floats: int, reps: int) -> dict:
    from edgefl.wire import Envelope, Limits, Payload, decode, encode

    arr = np.random.default_rng(0).standard_normal(floats).astype(np.float32)
    env = Envelope("train", 0, "d00", fleet="bench", algorithm="bench-echo", tier="1", payload=Payload({"weights": arr}))
    enc, dec = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        data = encode(env)
        t1 = time.perf_counter()
        back = decode(data, Limits())
        t2 = time.perf_counter()
        enc.append(t1 - t0)
        dec.append(t2 - t1)
        assert np.array_equal(back.payload.arrays["weights"], arr)
    n = len(data)
    return {
        "floats": floats,
        "message_bytes": n,
        "encode_seconds": statistics.median(enc),
        "decode_seconds": statistics.median(dec),
        "encode_decode_bytes_per_s": n / (statistics.median(enc) + statistics.median(dec)),
    }, data


def raw_paho_throughput(url: str, data: bytes, messages: int) -> dict:
    """Publish ``messages`` copies of ``data`` (QoS 1) and time until a subscriber has them all."""
    import paho.mqtt.client as mqtt

    from edgefl.transport.mqtt import BrokerAddress

    addr = BrokerAddress.parse(url)
    got = threading.Event()
    count = [0]
    subscribed = threading.Event()

    def on_message(client, userdata, msg):
        count[0] += 1
        if count[0] >= messages:
            got.set()

    def on_connect(client, userdata, flags, reason, properties):
        client.subscribe("bench/raw", qos=1)

    sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="bench-raw-sub", protocol=mqtt.MQTTv311)
    sub.on_connect = on_connect
    sub.on_subscribe = lambda *a: subscribed.set()
    sub.on_message = on_message
    pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="bench-raw-pub", protocol=mqtt.MQTTv311)
    for c in (sub, pub):
        c.connect(addr.host, addr.port)
        c.loop_start()
    try:
        if not subscribed.wait(30):
            raise RuntimeError("raw subscriber did not subscribe")
        t0 = time.perf_counter()
        for _ in range(messages):
            pub.publish("bench/raw", data, qos=1)
        if not got.wait(600):
            raise RuntimeError(f"raw subscriber got {count[0]} of {messages} messages")
        seconds = time.perf_counter() - t0
    finally:
        for c in (sub, pub):
            c.loop_stop()
            c.disconnect()
    return {"messages": messages, "seconds": seconds, "bytes_per_s": messages * len(data) / seconds}


# --- 2. edgefl over MQTT ---------------------------------------------------------------------


def edgefl_config(n: int, floats: int, rounds: int, out_dir: Path, name: str, **more):
    """The bench-echo run of ``n`` devices; ``more`` overrides run settings (``train_samples``)."""
    from edgefl.algorithms import get_algorithm
    from edgefl.config import resolve_config

    explicit = {
        "algorithm": "bench-echo",
        "options": {"floats": str(floats)},
        "dataset": "synthetic",
        "clients": n,
        "min_devices": n,
        "rounds": rounds,
        "eval_every": 0,
        "steps": 1,
        "test_samples": 50,
        "eval_samples": 50,
        "min_size": 5,
        "out_dir": str(out_dir),
        "run_name": name,
        **more,
    }
    return resolve_config(explicit, dict(get_algorithm("bench-echo").defaults))


def round_stats(records: list[dict]) -> dict:
    overhead = [r["round_seconds"] - max(r["train_seconds"].values(), default=0.0) for r in records]
    return {
        "rounds": len(records),
        "overhead_seconds_per_round": overhead,
        "round_seconds": [r["round_seconds"] for r in records],
        "slowest_local_work_seconds": [max(r["train_seconds"].values(), default=0.0) for r in records],
        "aggregate_seconds": [r["aggregate_seconds"] for r in records],
        "completed": [len(r["completed"]) for r in records],
        "failed_per_round": [len(r["failed"]) for r in records],
        "retries": [r.get("transport", {}).get("retries", 0) for r in records],
        "bytes_down_total": [r["bytes_down_total"] for r in records],
        "bytes_up_total": [r["bytes_up_total"] for r in records],
        "overhead_steady_median_s": steady(overhead),
        "overhead_first_round_s": overhead[0],
    }


def run_edgefl_mqtt(broker_kind: str, n: int, floats: int, rounds: int, processes: int, workdir: Path, nodelay: bool = False) -> dict:
    from benchmarks.overhead import nodelay as tcp
    from edgefl.runtime.server import ServeOptions, serve

    name = f"mqtt-{broker_kind}-{n}x{floats}{'-nodelay' if nodelay else ''}"
    work = workdir / name
    work.mkdir(parents=True)
    broker = start_broker(broker_kind, work, nodelay)
    if nodelay:
        tcp.enable()
    env = {**os.environ, "EDGEFL_BENCH_NODELAY": "1" if nodelay else "0"}
    fleet = f"bench{os.getpid()}{broker_kind[:3]}{n}"
    specs = device_specs(broker.url, fleet, n)
    procs = []
    t_start = time.perf_counter()
    watch = MemoryWatch().start()
    if getattr(broker, "proc", None) is not None:  # Mosquitto: its own process
        watch.watch("broker", [broker.proc.pid])
    try:
        procs = spawn_devices(HERE / "device_main.py", specs, processes, work, env)
        records: list[dict] = []
        cfg = edgefl_config(n, floats, rounds, work, "run")
        serve(cfg, ServeOptions(broker=broker.url, fleet=fleet, deadline=600, wait_for_devices=1200), on_round=records.append)
        wall = time.perf_counter() - t_start
    finally:
        stop_processes(procs, grace=60)
        peaks = watch.stop()
        broker.stop()
        tcp.disable()
    return {
        "transport": "mqtt",
        "broker": broker_kind + (" +TCP_NODELAY" if nodelay else ""),
        "tcp_nodelay": nodelay,
        "devices": n,
        "device_processes": processes,
        "floats": floats,
        "payload_mb": floats * 4 / 1e6,
        "wall_seconds_incl_startup": wall,
        "broker_peak_rss_bytes": peaks.get("broker"),
        **round_stats(records),
    }


def run_edgefl_memory(n: int, floats: int, rounds: int, workdir: Path) -> dict:
    from edgefl.runtime.simulation import simulate

    records: list[dict] = []
    cfg = edgefl_config(n, floats, rounds, workdir, f"memory-{n}x{floats}")
    simulate(cfg, on_round=records.append)
    return {"transport": "memory", "broker": None, "devices": n, "device_processes": 0, "floats": floats, "payload_mb": floats * 4 / 1e6, **round_stats(records)}


# --- 4. Flower ---------------------------------------------------------------------------------


def ensure_flower_venv() -> Path:
    python = FLOWER_VENV / "bin" / "python"
    if not python.exists():
        log.warning("creating the Flower venv in %s (pip install 'flwr[simulation]')", FLOWER_VENV)
        subprocess.run([sys.executable, "-m", "venv", str(FLOWER_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "flwr[simulation]"], check=True)
    return python


def run_flower(n: int, floats: int, rounds: int, workdir: Path) -> dict:
    python = ensure_flower_venv()
    out = workdir / f"flower-{n}x{floats}.json"
    logf = workdir / f"flower-{n}x{floats}.log"
    with open(logf, "wb") as f:
        subprocess.run(
            [str(python), str(HERE / "flower_toy.py"), "--clients", str(n), "--rounds", str(rounds), "--floats", str(floats), "--out", str(out)],
            check=True,
            stdout=f,
            stderr=subprocess.STDOUT,
        )
    res = json.loads(out.read_text())
    overhead = [r["round_seconds"] for r in res["rounds"]]  # local work is nil: the round is overhead
    return {
        "transport": "flower-simulation (ray)",
        "flwr": res["flwr"],
        "devices": n,
        "floats": floats,
        "payload_mb": floats * 4 / 1e6,
        "replies": [r["replies"] for r in res["rounds"]],
        "overhead_seconds_per_round": overhead,
        "overhead_steady_median_s": steady(overhead),
        "overhead_first_round_s": overhead[0],
        "wall_seconds_incl_startup": res["wall_seconds"],
    }


# --- report ----------------------------------------------------------------------------------


def write_report(results: dict, out: Path) -> None:
    write_json(out / "results.json", results)
    lines = [
        "# Orchestration overhead: edgefl (MQTT, in memory) vs Flower simulation",
        "",
        f"Command: `{results['command']}`",
        "",
        f"Machine: {results['machine_before']['cores']} cores, {results['machine_before']['cpu']}, "
        f"{results['machine_before']['ram_gb']} GB; load average before {results['machine_before']['loadavg_1_5_15']}, "
        f"after {results['machine_after']['loadavg_1_5_15']} (the load "
        "of each section is in results.json). Every number comes from this one run.",
        "",
        "Workload `bench-echo`: devices echo the server's float32 array (no local work), the server "
        "averages. Overhead per round = round wall time − slowest device's local work; steady = median "
        f"of rounds 2..{results['settings']['rounds']} (2..{results['settings']['heavy_rounds']} with the large payload; "
        "round 1 includes warm-up).",
        "",
        "| transport | broker | devices (processes) | payload | overhead/round steady | round 1 | failed | broker peak RSS |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results["runs"]:
        procs = f"{r['devices']} ({r.get('device_processes', 0) or 'in-process'})" if r["transport"] != "flower-simulation (ray)" else f"{r['devices']} (Ray actors)"
        failed = sum(r["failed_per_round"]) if "failed_per_round" in r else (r["devices"] * len(r["replies"]) - sum(r["replies"]))
        lines.append(
            f"| {r['transport']} | {r.get('broker') or '-'} | {procs} | {r['payload_mb']:.3f} MB | "
            f"{1000 * r['overhead_steady_median_s']:.1f} ms | {1000 * r['overhead_first_round_s']:.0f} ms | {failed} | "
            f"{'-' if not r.get('broker_peak_rss_bytes') else format(r['broker_peak_rss_bytes'] / 1e6, '.0f') + ' MB'} |"
        )
    lines += [
        "",
        f"## Ratio to Flower (same {results['settings']['small_fleet']}-client workload; target ≥ 20×)",
        "",
        "Flower's steady overhead per round ÷ edgefl's (above 1: edgefl is faster; below 1: slower).",
        "",
    ]
    for k, v in results["ratios"].items():
        verdict = "meets" if v >= 20 else "misses"
        lines.append(f"- {k}: **{v:.1f}×** ({verdict} the 20× target)")
    c = results["codec"]
    lines += [
        "",
        "## Envelope codec vs raw MQTT publish (ResNet-18-sized payload)",
        "",
        f"- message: {c['message_bytes'] / 1e6:.1f} MB ({c['floats']:,} float32 + envelope header)",
        f"- edgefl encode {1000 * c['encode_seconds']:.0f} ms + decode (with validation and checksum) {1000 * c['decode_seconds']:.0f} ms: "
        f"**{c['encode_decode_bytes_per_s'] / 1e6:.0f} MB/s**",
    ]
    for b, r in results["raw_paho"].items():
        lines.append(f"- raw paho publish → subscriber through {b}: **{r['bytes_per_s'] / 1e6:.0f} MB/s** ({r['messages']} messages)")
    for r in results["runs"]:  # whole rounds of large messages through edgefl against the raw publish
        raw = results["raw_paho"].get(r.get("broker") or "")
        if r["transport"] != "mqtt" or r["payload_mb"] < 1 or not raw or not r.get("round_seconds"):
            continue
        moved = statistics.median(d + u for d, u in zip(r["bytes_down_total"], r["bytes_up_total"], strict=True))  # per round
        rate = moved / statistics.median(r["round_seconds"])
        retries = sum(sum(per_device.values()) for per_device in r["retries"])  # per round: {device: re-sends}
        lines.append(f"- edgefl over {r['broker']}, {r['devices']} devices × {r['payload_mb']:.1f} MB each way: {moved / 1e6:,.0f} MB "
                     f"per round in a median {statistics.median(r['round_seconds']):.2f} s: **{rate / 1e6:.0f} MB/s**, "
                     f"{rate / raw['bytes_per_s']:.2f}× the raw publish; {retries} requests re-sent; broker peak "
                     f"{(r.get('broker_peak_rss_bytes') or 0) / 2**20:,.0f} MiB")
    if results.get("findings"):
        lines += ["", "## Findings (analysis of this run's numbers, written after it)", ""] + [f"- {n}" for n in results["findings"]]
    lines += ["", "## Notes", ""] + [f"- {n}" for n in results["notes"]]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        runs = results["runs"]
        def label(r: dict) -> str:
            broker = (r.get("broker") or "").replace(" +TCP_NODELAY", "\n+NODELAY")
            return f"{r['transport'].split(' ')[0]}\n{broker}\n{r['devices']}×{r['payload_mb']:.2g}MB"

        labels = [label(r) for r in runs]
        fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(runs)), 4))
        ax.bar(range(len(runs)), [1000 * r["overhead_steady_median_s"] for r in runs], color=["tab:orange" if "flower" in r["transport"] else "tab:blue" for r in runs])
        ax.set_yscale("log")
        ax.set_xticks(range(len(runs)), labels, fontsize=7)
        ax.set_ylabel("overhead per round (ms, log)")
        ax.set_title("orchestration overhead per round (steady state)")
        fig.tight_layout()
        fig.savefig(out / "overhead.png", dpi=120)
    except Exception as e:  # a plot must not cost the results
        log.warning("no plot: %s", e)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke test: 3 devices, 3 rounds, small payloads")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--heavy-rounds", type=int, default=3, help="rounds of the runs with the large payload")
    ap.add_argument("--brokers", default="mosquitto,embedded")
    ap.add_argument("--heavy-floats", type=int, default=RESNET18_FLOATS, help="the large payload (float32 values)")
    ap.add_argument("--many", type=int, default=50, help="the large fleet's device count")
    ap.add_argument("--processes", type=int, default=10, help="device processes for the large fleet")
    ap.add_argument("--heavy-devices", type=int, default=10, help="device processes of the MQTT runs with the large payload")
    ap.add_argument("--heavy-brokers", default="mosquitto", help="brokers of the MQTT runs with the large payload")
    ap.add_argument("--many-brokers", default="mosquitto", help="brokers of the large-fleet runs")
    ap.add_argument("--nodelay-brokers", default="mosquitto,embedded", help="brokers with a TCP_NODELAY row")
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--report-only", action="store_true", help="rewrite results.md/overhead.png from results.json")
    args = ap.parse_args()
    if args.report_only:
        write_report(json.loads((args.out / "results.json").read_text()), args.out)
        print((args.out / "results.md").read_text())
        return
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    log.setLevel(logging.INFO)

    rounds = 3 if args.quick else args.rounds
    small_n, many = (3, 4) if args.quick else (10, args.many)
    heavy = 100_000 if args.quick else args.heavy_floats
    brokers = [b.strip() for b in args.brokers.split(",") if b.strip()]
    big_procs = args.processes if not args.quick else 2
    heavy_n = min(args.heavy_devices, small_n)

    def names(text: str) -> list[str]:
        return [b.strip() for b in text.split(",") if b.strip()]

    heavy_brokers, many_brokers, nodelay_brokers = names(args.heavy_brokers), names(args.many_brokers), names(args.nodelay_brokers)
    heavy_rounds = min(rounds, args.heavy_rounds)
    results: dict = {
        "command": "nice -n 10 .venv/bin/python benchmarks/overhead/run.py " + " ".join(sys.argv[1:]),
        "settings": {"rounds": rounds, "heavy_rounds": heavy_rounds, "heavy_devices": heavy_n, "heavy_brokers": heavy_brokers, "many_brokers": many_brokers, "nodelay_brokers": nodelay_brokers, "brokers": brokers, "heavy_floats": heavy, "trivial_floats": TRIVIAL_FLOATS, "small_fleet": small_n, "large_fleet": many, "large_fleet_processes": args.processes},
        "machine_before": machine(),
        "runs": [],
        "sections": {},
        "notes": [
            (
                f"Every MQTT run uses one OS process per device ({many} processes for the {many}-device fleet). A device "
                "process costs ~300 MB of private memory (torch; torchvision is imported only for torchvision models)."
                if big_procs >= many else
                f"{small_n}-device MQTT runs use one OS process per device; the {many}-device runs put {many // big_procs} "
                f"devices (threads, each with its own MQTT connection and device half) in each of {big_procs} processes "
                "(--processes) to save memory. The broker and the server see separate clients either way."
            ),
            f"The ResNet-18-sized payload ({RESNET18_FLOATS:,} float32, 44.7 MB each way per device) runs over MQTT with "
            f"{heavy_n} device processes on {', '.join(heavy_brokers)} only. A first attempt with 10 devices over Mosquitto "
            "on this loaded machine (load average 16-26 on 2 cores) took 221 s for round 1: the server's acknowledgement "
            "timeout (retry_after 2 s, doubling) expired while 45 MB messages queued, it re-sent the downlinks (2-8 retries "
            "per device), Mosquitto's resident memory grew to 7.5 GB, and the run was stopped to protect the shared machine "
            "(that was before re-send delays grew with message size; large envelopes now travel in chunks with a bounded "
            "window and progress-driven re-sends, measured with 10 devices in benchmarks/overhead/chunked/). "
            "50 devices with that payload were not attempted. In memory and in Flower the large payload runs with 10 devices.",
            "The embedded amqtt broker runs in the server's process (as `edgefl simulate --transport mqtt` runs it); Mosquitto is its own process.",
            "edgefl's transport sets TCP_NODELAY on every paho client and broker/mosquitto.conf sets `set_tcp_nodelay true` "
            "(without them, small request/reply exchanges wait for the peer's delayed ACK, ~40 ms on Linux); the embedded "
            "amqtt broker's own sockets keep Nagle. '+TCP_NODELAY' rows (--nodelay-brokers) also set it on the benchmark's "
            "own Mosquitto through benchmarks/overhead/nodelay.py.",
            "Flower's in-memory Grid polls for replies every 0.1 s (InMemoryGrid pull_interval default), which sets "
            "the floor of its round time; the benchmark uses Flower's defaults.",
            "Flower: flwr[simulation] in benchmarks/overhead/.venv-flower (pip, separate from edgefl's dependencies); "
            "client_resources num_cpus=1, fraction_evaluate=0; its round = configure_train → aggregate_train.",
        ],
    }
    with tempfile.TemporaryDirectory(prefix="edgefl-overhead-") as tmp:
        workdir = Path(tmp)

        def section(name: str, fn):
            log.info("section %s …", name)
            before = machine()["loadavg_1_5_15"]
            t0 = time.perf_counter()
            try:
                out = fn()
            except Exception as e:  # record the failure, keep the other sections' results
                log.exception("section %s failed", name)
                results["notes"].append(f"section {name} FAILED: {type(e).__name__}: {e}")
                out = None
            results["sections"][name] = {"loadavg_before": before, "loadavg_after": machine()["loadavg_1_5_15"], "seconds": time.perf_counter() - t0}
            log.info("section %s done in %.0f s", name, time.perf_counter() - t0)
            return out

        codec, data = section("codec", lambda: codec_throughput(RESNET18_FLOATS if not args.quick else heavy, reps=3 if args.quick else 5))
        results["codec"] = codec
        results["raw_paho"] = {}
        for b in brokers:

            def raw(b=b, data=data):
                broker = start_broker(b, workdir / f"raw-{b}")
                try:
                    return raw_paho_throughput(broker.url, data, messages=3 if args.quick else 5)
                finally:
                    broker.stop()

            results["raw_paho"][b] = section(f"raw-paho-{b}", raw)
        del data

        plan = []
        for b in brokers:
            plan += [("mqtt", b, small_n, TRIVIAL_FLOATS, small_n, False)]
            if b in nodelay_brokers:
                plan += [("mqtt", b, small_n, TRIVIAL_FLOATS, small_n, True)]
            if b in many_brokers:
                plan += [("mqtt", b, many, TRIVIAL_FLOATS, big_procs, False)]
            if b in heavy_brokers:
                plan += [("mqtt", b, heavy_n, heavy, heavy_n, False)]
        plan += [("memory", None, small_n, TRIVIAL_FLOATS, 0, False), ("memory", None, small_n, heavy, 0, False)]
        plan += [("flower", None, small_n, TRIVIAL_FLOATS, 0, False), ("flower", None, small_n, heavy, 0, False)]
        for kind, b, n, floats, procs, nodelay in plan:
            name = f"{kind}-{b or ''}-{n}x{floats}{'-nodelay' if nodelay else ''}"
            R = heavy_rounds if floats == heavy else rounds
            if kind == "mqtt":
                r = section(name, lambda b=b, n=n, floats=floats, procs=procs, nodelay=nodelay, R=R: run_edgefl_mqtt(b, n, floats, R, procs, workdir, nodelay))
            elif kind == "memory":
                r = section(name, lambda n=n, floats=floats, R=R: run_edgefl_memory(n, floats, R, workdir))
            else:
                r = section(name, lambda n=n, floats=floats, R=R: run_flower(n, floats, R, workdir))
            if r is None:
                continue
            r["loadavg"] = results["sections"][name]
            results["runs"].append(r)
            log.info("%s: steady overhead %.1f ms/round", name, 1000 * r["overhead_steady_median_s"])
            write_json(args.out / "results.partial.json", results)

    def find(transport: str, broker, floats: int) -> dict | None:
        return next((r for r in results["runs"] if r["transport"].startswith(transport) and r.get("broker") == broker and r["floats"] == floats and r["devices"] == (small_n if transport != "mqtt" or floats != heavy else heavy_n)), None)

    results["ratios"] = {}
    for floats, label in ((TRIVIAL_FLOATS, "trivial payload"), (heavy, "ResNet-18 payload")):
        flower = find("flower", None, floats)
        for transport, b in [("mqtt", x) for x in brokers] + [("mqtt", x + " +TCP_NODELAY") for x in brokers] + [("memory", None)]:
            mine = find(transport, b, floats)
            if flower and mine and mine["overhead_steady_median_s"] > 0 and mine["devices"] == flower["devices"]:
                key = f"edgefl {transport}{' ' + b if b else ''}, {small_n} devices, {label}"
                results["ratios"][key] = flower["overhead_steady_median_s"] / mine["overhead_steady_median_s"]
    results["machine_after"] = machine()
    write_report(results, args.out)
    (args.out / "results.partial.json").unlink(missing_ok=True)
    print((args.out / "results.md").read_text())


if __name__ == "__main__":
    main()
