"""Large payloads over Mosquitto in chunks: N devices × a ResNet-18-sized payload each way, beside
raw paho through the same broker, in one run.

    nice -n 10 .venv/bin/python -m benchmarks.overhead.chunked              # 10 devices, 3 rounds
    nice -n 10 .venv/bin/python -m benchmarks.overhead.chunked --devices 3 --rounds 2 \
--floats 1000000

Measured (load average recorded before and after each section):

1. **raw paho, one stream**: one publisher sends ``--raw-messages`` copies of the envelope-sized
   payload (QoS 1) to one subscriber through Mosquitto; bytes/s until the subscriber has them all.
2. **raw paho, the round's traffic**: one client publishes the payload to each of N clients (their
   own topics, QoS 1), each publishes it back (QoS 1); bytes/s of both directions until the first
   client has every echo. The N clients run in one other process (``raw_echo``).
3. **edgefl**: ``serve`` (this process) with the ``bench-echo`` workload and N devices in
   ``--processes`` device processes (``device_main.py``, which runs ``run_device``), every envelope
   in chunks (the default 4 MiB threshold). Per round: wall time, bytes both ways, envelope
   re-sends, chunk re-sends and stalls (server side), duplicate chunks received (a device's
   re-send shows up there), and the resident memory of the mosquitto process, of the server
   process and of all device processes (psutil, sampled every 0.2 s).

Throughput ratio = edgefl's bytes per second in a steady round (median of rounds 2..R) ÷ raw
paho's, both measured here. Results: ``chunked/results.json`` and ``chunked/results.md``.
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

import benchmarks.overhead.echo  # noqa: F401  (registers bench-echo)
from benchmarks.common import (
    MemoryWatch,
    device_specs,
    machine,
    spawn_devices,
    stop_processes,
    write_json,
)
from benchmarks.overhead.echo import RESNET18_FLOATS
from benchmarks.overhead.raw_echo import RawServer
from benchmarks.overhead.run import edgefl_config
from benchmarks.timing import ROOT, invocation, load

HERE = Path(__file__).resolve().parent
log = logging.getLogger("chunked")


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

    sub = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2, client_id="bench-raw-sub", protocol=mqtt.MQTTv311
    )
    sub.on_connect = on_connect
    sub.on_subscribe = lambda *a: subscribed.set()
    sub.on_message = on_message
    pub = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2, client_id="bench-raw-pub", protocol=mqtt.MQTTv311
    )
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


def raw_round_trip(url: str, n: int, nbytes: int, rounds: int, watch: MemoryWatch) -> dict:
    """One client sends ``nbytes`` to each of ``n`` echo clients (another process) and waits for
    every echo (:mod:`benchmarks.overhead.raw_echo`)."""
    prefix = f"chunkraw{os.getpid()}"
    echo = subprocess.Popen([sys.executable, "-m", "benchmarks.overhead.raw_echo", url, prefix,
                             *map(str, range(n))], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    watch.watch("raw echo clients", [echo.pid])
    try:
        if echo.stdout.readline().strip() != "ready":
            raise RuntimeError("raw echo clients did not start")
        hub = RawServer(url, prefix, n, max_inflight=100)
        data = os.urandom(nbytes)
        seconds = [hub.round(data) for _ in range(rounds)]
        hub.close()
    finally:
        echo.terminate()
        echo.wait(20)
    per_round = statistics.median(seconds[1:] if len(seconds) > 1 else seconds)
    return {"devices": n, "bytes_each_way": nbytes, "rounds": rounds, "round_seconds": seconds,
            "steady_round_s": per_round, "bytes_per_s": 2 * n * nbytes / per_round}


def run_edgefl(
    url: str, n: int, floats: int, rounds: int, processes: int, work: Path, watch: MemoryWatch
) -> dict:
    from edgefl.runtime.server import ServeOptions, serve

    procs = []
    records: list[dict] = []
    box: dict = {}
    try:
        procs = spawn_devices(
            "benchmarks.overhead.device_main",
            device_specs(url, f"chunks{os.getpid()}", n),
            processes,
            work,
        )
        watch.watch("devices", [p.pid for p in procs])

        def on_round(r: dict) -> None:
            r["memory_now"] = watch.sample()
            r["loadavg"] = load()
            records.append(r)

        cfg = edgefl_config(n, floats, rounds, work, "run")
        serve(
            cfg,
            ServeOptions(
                broker=url, fleet=f"chunks{os.getpid()}", deadline=900, wait_for_devices=1200
            ),
            on_round=on_round,
            on_started=lambda t: box.__setitem__("transport", t),
        )
    finally:
        stop_processes(procs, grace=120)
    tr = box["transport"]
    per_round = []
    for r in records:
        moved = r["bytes_down_total"] + r["bytes_up_total"]
        per_round.append(
            {
                "round": r["round"],
                "round_seconds": r["round_seconds"],
                "completed": len(r["completed"]),
                "failed": len(r["failed"]),
                "bytes_moved": moved,
                "bytes_per_s": moved / r["round_seconds"],
                "envelope_resends": sum(r["transport"]["retries"].values()),
                "chunks_resent_total": r["transport"]["chunks_sent_total"]["resent"],
                "chunk_stalls_total": r["transport"]["chunks_sent_total"]["stalls"],
                "duplicate_chunks_received_total": r["transport"]["chunks_received_total"][
                    "duplicates"
                ],
                "rejected": r["transport"]["rejected"],
                "memory_bytes_at_end": r["memory_now"],
                "loadavg": r["loadavg"],
            }
        )
    steady = [p["bytes_per_s"] for p in per_round[1:]] or [p["bytes_per_s"] for p in per_round]
    return {
        "devices": n,
        "device_processes": processes,
        "floats": floats,
        "rounds": per_round,
        "steady_bytes_per_s": statistics.median(steady),
        "server_chunks": {
            "sent": json.loads(json.dumps(tr.chunker.stats.__dict__)),
            "received": json.loads(json.dumps(tr.reassembly.stats.__dict__)),
            "settings": {
                k: getattr(tr.chunks, k)
                for k in ("threshold", "chunk_size", "window", "max_inflight_bytes")
            },
        },
    }


def write_report(res: dict, out: Path) -> None:
    e, raw1, rawn = res["edgefl"], res["raw_one_stream"], res["raw_round_trip"]
    mb = 1e6
    lines = [
        f"# {e['devices']} devices × {res['payload_mb']:.1f} MB each way over Mosquitto, in chunks",
        "",
        f"Command: `{res['command']}`",
        "",
        f"Machine: {res['machine']['cores']} cores, {res['machine']['cpu']}, "
        f"{res['machine']['ram_gb']} GB. "
        f"Load average before {res['load_before']}, after {res['load_after']} (each section's in "
        "results.json). "
        "Every number comes from this one run; the machine was shared, so the absolute rates are "
        "not idle ones — compare the ratios.",
        "",
        "## Checks",
        "",
    ]
    for c in res["checks"]:
        lines.append(f"- {'**met**' if c['met'] else '**not met**'}: {c['what']} — {c['measured']}")
    lines += [
        "",
        "## Rounds",
        "",
        "| round | seconds | completed | MB moved | MB/s | envelope re-sends | chunks re-sent "
        "(total) | stalls (total) | duplicate chunks received (total) | mosquitto RSS at end (MB) "
        "| load |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in e["rounds"]:
        lines.append(
            f"| {r['round']} | {r['round_seconds']:.2f} | {r['completed']} | "
            f"{r['bytes_moved'] / mb:.0f} | {r['bytes_per_s'] / mb:.0f} | "
            f"{r['envelope_resends']} | {r['chunks_resent_total']} | {r['chunk_stalls_total']} | "
            f"{r['duplicate_chunks_received_total']} | "
            f"{r['memory_bytes_at_end'].get('mosquitto', 0) / mb:.0f} | {r['loadavg'][0]} |"
        )
    s = e["server_chunks"]
    lines += [
        "",
        "## Throughput, side by side",
        "",
        f"- edgefl, steady round (median of rounds 2..R): **{e['steady_bytes_per_s'] / mb:.0f} "
        "MB/s** (both directions)",
        f"- raw paho, the same round's traffic ({rawn['devices']} echo clients in one process): "
        f"**{rawn['bytes_per_s'] / mb:.0f} MB/s** "
        f"(steady round {rawn['steady_round_s']:.2f} s)",
        f"- raw paho, one stream ({raw1['messages']} messages of {res['payload_mb']:.1f} MB): "
        f"**{raw1['bytes_per_s'] / mb:.0f} MB/s**",
        "",
        "## Memory (peak resident, sampled every 0.2 s)",
        "",
    ]
    for name, peak in res["memory_peak"].items():
        lines.append(f"- {name}, during the edgefl rounds: {peak / mb:.0f} MB")
    for name, peak in res["memory_peak_raw"].items():
        lines.append(f"- {name}, during the raw paho sections: {peak / mb:.0f} MB")
    lines += [
        "",
        "## Chunk layer (server side, whole run)",
        "",
        f"- settings: {s['settings']}",
        f"- sent: {s['sent']}",
        f"- received: {s['received']}",
        "",
    ]
    (out / "results.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--devices", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--processes", type=int, default=5, help="device processes (devices are spread over them)"
    )
    ap.add_argument("--floats", type=int, default=RESNET18_FLOATS)
    ap.add_argument("--raw-messages", type=int, default=5)
    ap.add_argument("--out", type=Path, default=HERE / "chunked")
    args = ap.parse_args()
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    import numpy as np

    from edgefl.transport.broker import MosquittoBroker
    from edgefl.wire import Envelope, Payload, encode

    args.out.mkdir(parents=True, exist_ok=True)
    res: dict = {
        "command": invocation()["command"],
        "machine": machine(),
        "load_before": load(),
        "payload_mb": args.floats * 4 / 1e6,
    }
    nbytes = len(
        encode(
            Envelope(
                "train",
                1,
                "d000",
                fleet="f",
                payload=Payload({"weights": np.zeros(args.floats, np.float32)}),
            )
        )
    )
    work = Path(tempfile.mkdtemp(prefix="edgefl-chunked-"))
    broker = MosquittoBroker(workdir=work / "mosquitto").start()
    watch = MemoryWatch().start()
    watch.watch("mosquitto", [broker.proc.pid])
    watch.watch("server (this process)", [os.getpid()])
    try:
        t = load()
        res["raw_one_stream"] = {
            **raw_paho_throughput(broker.url, os.urandom(nbytes), args.raw_messages),
            "load_before": t,
            "load_after": load(),
        }
        res["memory_after_raw_one_stream"] = watch.sample()
        t = load()
        res["raw_round_trip"] = {
            **raw_round_trip(broker.url, args.devices, nbytes, args.rounds, watch),
            "load_before": t,
            "load_after": load(),
        }
        res["memory_peak_raw"] = dict(watch.peak)
        watch.groups.pop("raw echo clients", None)
        watch.peak = {k: 0 for k in watch.groups}  # the edgefl section's own peaks
        t = load()
        res["edgefl"] = {
            **run_edgefl(
                broker.url, args.devices, args.floats, args.rounds, args.processes, work, watch
            ),
            "load_before": t,
            "load_after": load(),
        }
    finally:
        res["memory_peak"] = watch.stop()
        broker.stop()
    res["load_after"] = load()
    e = res["edgefl"]
    ratio_round = e["steady_bytes_per_s"] / res["raw_round_trip"]["bytes_per_s"]
    ratio_stream = e["steady_bytes_per_s"] / res["raw_one_stream"]["bytes_per_s"]
    resends = sum(r["envelope_resends"] for r in e["rounds"])
    chunk_resends = e["rounds"][-1]["chunks_resent_total"] if e["rounds"] else None
    dups = e["rounds"][-1]["duplicate_chunks_received_total"] if e["rounds"] else None
    mosq = res["memory_peak"]["mosquitto"]
    res["checks"] = [
        {
            "what": f"every round completes with all {args.devices} devices",
            "met": all(r["completed"] == args.devices for r in e["rounds"])
            and len(e["rounds"]) == args.rounds,
            "measured": f"{[r['completed'] for r in e['rounds']]} devices per round",
        },
        {
            "what": "no re-send (envelopes, server chunks, and device chunks seen as duplicates at "
            "the server)",
            "met": resends == 0 and chunk_resends == 0 and dups == 0,
            "measured": f"{resends} envelope re-sends, {chunk_resends} chunks re-sent, "
            f"{dups} duplicate chunks received",
        },
        {
            "what": "the broker's resident memory stays under 1 GB",
            "met": mosq < 1e9,
            "measured": f"peak {mosq / 1e6:.0f} MB",
        },
        {
            "what": "throughput at least half of raw paho's for the same round's traffic",
            "met": ratio_round >= 0.5,
            "measured": f"{ratio_round:.2f}×",
        },
        {
            "what": "throughput at least half of raw paho's single stream",
            "met": ratio_stream >= 0.5,
            "measured": f"{ratio_stream:.2f}×",
        },
    ]
    write_json(args.out / "results.json", res)
    write_report(res, args.out)
    print((args.out / "results.md").read_text())


if __name__ == "__main__":
    main()
