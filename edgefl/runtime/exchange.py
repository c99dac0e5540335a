"""What the round loop and the devices' agents share, apart from the loop itself: the metadata
keys an agent reads (:data:`UNCHANGED`, :data:`SEND_MODEL` with :data:`MODEL_PREFIX`,
:data:`MAX_SAMPLES`), one exchange's outcome (:class:`Exchange`) and the loop's settings
(:class:`LoopSettings`). The device side imports them without the server's round loop."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from edgefl.runtime.claims import DEFAULT_WEIGHT_RATIO
from edgefl.wire import Envelope, new_nonce

#: Downlink metadata meaning "the payload you absorbed at this round's evaluation, unchanged".
UNCHANGED = "unchanged_since"
#: Finish metadata asking the device to answer with its final model (arrays under MODEL_PREFIX).
SEND_MODEL = "send_model"
MODEL_PREFIX = "model/"
#: Evaluation metadata: evaluate on at most this many samples of the split.
MAX_SAMPLES = "max_samples"


@dataclass
class Exchange:
    """The outcome of one request to a set of devices."""

    replies: dict[str, Envelope] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    bytes_down: dict[str, int] = field(default_factory=dict)
    bytes_up: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    rejected: dict[str, int] = field(default_factory=dict)  # invalid replies refused, per device


@dataclass
class LoopSettings:
    rounds: int
    fleet: str = "default"
    algorithm: str = ""
    # replies from another run are refused
    run_id: str = field(default_factory=lambda: new_nonce()[:12])
    timeout: float | None = None  # per-round deadline in seconds (None: wait for every device)
    final_timeout: float | None = None  # the final evaluation's deadline (None: the round deadline)
    # test samples each device evaluates at the end (None: its whole split)
    final_samples: int | None = None
    # Ctrl-C: still send the finish exchange (a fleet: devices send their models)
    finish_on_interrupt: bool = False
    interrupt_timeout: float | None = 30.0  # that finish exchange's deadline
    eval_every: int = 1
    eval_split: str = "quick"  # per-round evaluation split; the final one uses "test"
    checkpoint_dir: Path | None = None
    stop_when_all_fail: bool = True  # a round where every device failed is a bug in a simulation
    # device-supplied weights ≤ this × median declared size (0: off)
    weight_ratio: float = DEFAULT_WEIGHT_RATIO
    # asynchronous: aggregate every this many arrivals (runtime/buffered.py); None: rounds
    buffer: int | None = None
