"""Device processes of the overhead benchmark, with ``bench-echo`` registered.

    python device_main.py SPEC.json

SPEC.json is a list of :class:`edgefl.runtime.device.DeviceOptions` fields; each device runs
``run_device`` (what ``edgefl train`` runs) in its own thread with its own MQTT connection.
One device per process is the real deployment shape; several per process let 50 devices fit
in this machine's memory (each process with torch costs ~390 MB of private memory).
"""

import json
import logging
import os
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import benchmarks.overhead.echo  # noqa: E402,F401  (registers bench-echo)
from edgefl.runtime.device import DeviceOptions, run_device  # noqa: E402


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(1)
    if os.environ.get("EDGEFL_BENCH_NODELAY") == "1":
        from benchmarks.overhead.nodelay import enable

        enable()
    specs = json.loads(Path(sys.argv[1]).read_text())
    threads = [threading.Thread(target=run_device, args=(DeviceOptions(**s),), daemon=True) for s in specs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
