"""The real CPU of chosen functions per round, no profiler: the 10-device echo workload over
Mosquitto, the server in this process and each device in its own.

    nice -n 10 .venv/bin/python -m benchmarks.overhead.investigations.functions_per_round \
        --devices 10 --floats 1000 --rounds 150

Each function in :data:`SERVER` and :data:`DEVICE` is wrapped, at run time, in a reading of its
thread's CPU clock (``time.thread_time``) before and after; printed over rounds 3..R (a device:
from its third request), per round: the server's functions, and each device function's mean over
the devices. A wrapped call inside another is counted in both. Unlike a profiler
(``profile_round``), nothing else is slowed down: the numbers are what the calls cost in the run,
cold caches included.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path

OUT_ENV = "EDGEFL_FUNCTIONS_OUT"
SKIP = 2

#: (module, class or None, function) of the server, and of a device
SERVER = [
    ("edgefl.runtime.loop", "RoundLoop", "run_round"),
    ("edgefl.runtime.loop", "RoundLoop", "exchange"),
    ("edgefl.transport.base", "Encoded", "_encoded"),
    ("edgefl.transport.mqtt.server", "MqttServerTransport", "request"),
    ("edgefl.transport.mqtt.server", "MqttServerTransport", "_send"),
    ("edgefl.transport.mqtt.server", "MqttServerTransport", "on_message"),
    ("edgefl.transport.mqtt.server", "MqttServerTransport", "_take_reply"),
    ("edgefl.runtime.status", "FleetStatus", "exchange_done"),
    ("edgefl.runtime.run", "RunLifecycle", "_record"),
    ("edgefl.report.recorder", "RunRecorder", "append_round"),
]
DEVICE = [
    ("edgefl.runtime.device", "DeviceRuntime", "_serve"),
    ("edgefl.runtime.agent", None, "decode"),
    ("edgefl.runtime.agent", "DeviceAgent", "handle"),
    ("edgefl.runtime.agent", "DeviceAgent", "_encode"),
    ("edgefl.transport.mqtt.device", "MqttDeviceEndpoint", "reply"),
    ("edgefl.transport.mqtt.device", "MqttDeviceEndpoint", "on_message"),
]


def wrap(targets: list[tuple[str, str | None, str]], counting: list[bool]) -> collections.Counter:
    """Wrap each target; returns the CPU seconds of each (label → seconds) while ``counting[0]``."""
    import importlib

    spent: collections.Counter = collections.Counter()
    for module, owner, name in targets:
        holder = importlib.import_module(module)
        if owner is not None:
            holder = getattr(holder, owner)
        original = getattr(holder, name)
        label = f"{owner}.{name}" if owner else f"{module}.{name}"

        def timed(*args, _original=original, _label=label, **kwargs):
            t = time.thread_time()
            try:
                return _original(*args, **kwargs)
            finally:
                if counting[0]:
                    spent[_label] += time.thread_time() - t

        setattr(holder, name, timed)
    return spent


def device_main(spec: str) -> None:
    """A device process of the benchmark (``benchmarks.overhead.device_main``), timed."""
    from benchmarks.overhead import device_main as devices
    from edgefl.runtime.device import DeviceRuntime

    counting, served = [False], [0]
    spent = wrap(DEVICE, counting)
    serve = DeviceRuntime._serve

    def counted(self, routing, data):
        served[0] += 1
        counting[0] = served[0] > SKIP
        return serve(self, routing, data)

    DeviceRuntime._serve = counted
    sys.argv = [sys.argv[0], spec]
    try:
        devices.main()
    finally:
        out = Path(os.environ[OUT_ENV]) / f"device-{os.getpid()}.json"
        out.write_text(json.dumps({"requests": served[0] - SKIP, "seconds": dict(spent)}))


def main() -> None:
    if len(sys.argv) == 2 and sys.argv[1].endswith(".json"):
        device_main(sys.argv[1])
        return
    from benchmarks.overhead.investigations import workload_parser

    ap = workload_parser(__doc__)
    args = ap.parse_args()

    import edgefl.runtime.server as server_module
    from benchmarks.common import spawn_devices, stop_processes
    from benchmarks.overhead import run as bench
    from benchmarks.timing import load
    from edgefl.transport.broker import MosquittoBroker

    counting, rounds = [False], [0]
    spent = wrap(SERVER, counting)

    def hook(record):
        rounds[0] += 1
        counting[0] = SKIP <= rounds[0] < args.rounds

    print(f"load {load()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="edgefl-functions-") as work:
        broker = MosquittoBroker(workdir=Path(work) / "mosquitto").start()
        env = {**os.environ, OUT_ENV: work}
        fleet = f"fn{os.getpid()}"
        procs = spawn_devices("benchmarks.overhead.investigations.functions_per_round",
                              bench.device_specs(broker.url, fleet, args.devices),
                              min(args.devices, 10), Path(work), env=env)
        try:
            server_module.serve(
                bench.edgefl_config(args.devices, args.floats, args.rounds, Path(work), "run"),
                server_module.ServeOptions(broker=broker.url, fleet=fleet, deadline=600,
                                           wait_for_devices=1200),
                on_round=hook)
        finally:
            stop_processes(procs, grace=60)
            broker.stop()
        k = args.rounds - SKIP
        print(f"server, µs per round ({k} rounds):")
        for label, seconds in spent.most_common():
            print(f"{1e6 * seconds / k:9.0f}  {label}")
        devices: collections.Counter = collections.Counter()
        reports = [json.loads(p.read_text()) for p in Path(work).glob("device-*.json")]
        for r in reports:
            for label, seconds in r["seconds"].items():
                devices[label] += seconds / max(1, r["requests"]) / len(reports)
    print(f"a device, µs per request (mean of {len(reports)} processes):")
    for label, seconds in devices.most_common():
        print(f"{1e6 * seconds:9.0f}  {label}")
    print(f"load {load()}", flush=True)


if __name__ == "__main__":
    main()
