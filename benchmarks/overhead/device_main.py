"""Device processes of the overhead benchmark, with ``bench-echo`` registered.

    python -m benchmarks.overhead.device_main SPEC.json

SPEC.json is a list of :class:`edgefl.runtime.device.DeviceOptions` fields; each device runs
``run_device`` (what ``edgefl train`` runs) in its own thread with its own MQTT connection.
One device per process is the real deployment shape; several per process let 50 devices fit
in this machine's memory (each process with torch costs ~390 MB of private memory).
"""

import json
import logging
import sys
import threading
from pathlib import Path

import torch

import benchmarks.overhead.echo  # noqa: F401  (registers bench-echo)
from edgefl.runtime.device import DeviceOptions, run_device


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(1)
    specs = json.loads(Path(sys.argv[1]).read_text())
    threads = [
        threading.Thread(target=run_device, args=(DeviceOptions(**s),), daemon=True) for s in specs
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
