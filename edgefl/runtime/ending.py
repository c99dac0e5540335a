"""How a fleet run ends: the devices' final models, who may still be asked, the final evaluation's
progress, and the record of an interrupted run.

Final models of a fleet run: every method the same way. The server asks for them: its ``finish``
request carries ``send_model``, and each device answers ``done`` with its final model's state as
arrays (``model/<name>``; float32 weights, int64 counters). The server checks them against the
model its spec builds (names, dtypes, shapes: :func:`expected_model_arrays`, in
:func:`~edgefl.wire.validate.check_reply` before the reply is accepted), loads them into that
model strictly, and writes ``runs/<name>/models/<id>.safetensors`` exactly as a simulation does,
so ``edgefl export --run`` and ``edgefl deploy --run`` work unchanged. The device sends its
model rather than the server keeping one because, across the methods, the server does not hold
the devices' final models: methods that share prototypes or knowledge never send weights, and
personalised methods keep parts of the model on the device. A device that misses the finish
exchange (offline, past the deadline) has no file; the summary names it (``models_missing``).
Nothing from the network is unpickled: the arrays come in the safetensors envelope.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edgefl.models import ModelSpec
from edgefl.wire.schema import ArraySpec, array_spec

log = logging.getLogger(__name__)


class ModelArrays:
    """Device → the arrays its final model must have (cached per model spec)."""

    def __init__(self, spec_of: Callable[[str], ModelSpec]):
        self.spec_of = spec_of
        self.cache: dict[str, dict[str, ArraySpec]] = {}

    def __call__(self, device_id: str) -> dict[str, ArraySpec]:
        spec = self.spec_of(device_id)
        key = repr(spec.to_dict())
        if key not in self.cache:
            self.cache[key] = expected_model_arrays(spec)
        return self.cache[key]


def expected_model_arrays(spec: ModelSpec, prefix: str = "model/") -> dict[str, ArraySpec]:
    from edgefl.models import build_model

    state = build_model(spec).state_dict()
    return {
        prefix + k: array_spec(np.float32 if t.is_floating_point() else np.int64, tuple(t.shape))
        for k, t in state.items()
    }


def save_final_models(run_dir: Path, models: Mapping[str, Mapping[str, np.ndarray]],
                      specs: Mapping[str, ModelSpec],
                      dataset: str) -> list[str]:
    """Write each device's received model to run_dir/models/<id>.safetensors; returns the ids
    written. A model that does not load into its spec strictly is not written (logged)."""
    import torch

    from edgefl.export.checkpoint import device_model_path
    from edgefl.models import build_model
    from edgefl.models.files import save_model_file

    written = []
    for device_id, arrays in sorted(models.items()):
        spec = specs[device_id]
        model = build_model(spec)
        try:
            model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in arrays.items()},
                                  strict=True)
        except RuntimeError as e:
            log.warning("device %s sent a final model that does not fit %s: %s", device_id,
                        spec.name, e)
            continue
        save_model_file(model, device_model_path(run_dir, device_id), spec=spec, dataset=dataset)
        written.append(device_id)
    return written


class Availability:
    """Whether a device may be asked: not while its Last Will (status "offline") is newer than its
    last registration. A device that comes back registers again and is asked again."""

    def __init__(self, status: Mapping[str, str], status_at: Mapping[str, float]):
        self.status, self.status_at = status, status_at
        self.registered_at: dict[str, float] = {}

    def registered(self, device_id: str) -> None:
        self.registered_at[device_id] = time.time()

    def __call__(self, device_id: str) -> bool:
        if self.status.get(device_id) != "offline":
            return True
        return self.status_at.get(device_id, 0.0) < self.registered_at.get(device_id, 0.0)

    def wait_for_any(self, devices: list[str], timeout: float, poll: float = 0.1) -> bool:
        """Before a round: when every one of ``devices`` is offline, wait for the first to come
        back (as the fleet clock's round waits), at most ``timeout`` seconds; a round of nobody
        would end at once, and the next, until the run's rounds are spent. Whether one is
        available."""
        if not devices or any(self(d) for d in devices):
            return True
        log.warning("every device is offline (its Last Will): waiting up to %g s for one to "
                    "come back before the round", timeout)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            time.sleep(poll)
            back = [d for d in devices if self(d)]
            if back:
                log.info("%s is back: the round starts", ", ".join(back))
                return True
        return False


class FinalProgress:
    """While the final evaluation runs: a line every ``every`` seconds (devices answered, time
    left)."""

    def __init__(self, status, say: Callable[[str], None], every: float = 10.0):
        self.status, self.say, self.every = status, say, every
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None

    def on_event(self, name: str, info: dict[str, Any]) -> None:
        if name == "final_evaluation":
            deadline = info.get("deadline")
            samples = info.get("samples")
            self.say(f"final evaluation of {info['devices']} devices on the test split"
                     + (f" ({samples} samples each)" if samples else "")
                     + (f", deadline {deadline:g} s" if deadline is not None else ""))
            self.stop_event.clear()
            self.thread = threading.Thread(target=self._tick, name="edgefl-final-progress",
                                           daemon=True)
            self.thread.start()
        elif name == "final_evaluation_done":
            self.stop_event.set()
            missed = info.get("failed") or []
            self.say(
                f"final evaluation: {info['answered']} of {info['devices']} devices answered"
                + (
                    f"; missing: {', '.join(missed)} (their last per-round evaluation stands in)"
                    if missed
                    else ""
                )
            )

    def _tick(self) -> None:
        while not self.stop_event.wait(self.every):
            with self.status.lock:
                open_ = list(self.status.open)
                deadline = self.status.exchange_deadline
            if not open_:
                continue
            answered = sum(1 for d in open_ if self.status.replied(d))
            left = f", {max(0.0, deadline - time.time()):.0f} s left" if deadline else ""
            self.say(f"final evaluation: {answered} of {len(open_)} devices answered{left}")

    def close(self) -> None:
        self.stop_event.set()
