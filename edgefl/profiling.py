"""Device resource profiles and the one tier policy of edgefl.

A :class:`DeviceProfile` says what a device is (architecture, CPU model and cores, RAM total and
available, board and accelerator: CUDA via torch, Jetson via ``/etc/nv_tegra_release`` or the
device-tree model, Raspberry Pi via ``/proc/device-tree/model``) and how fast it trains, from a
short measured benchmark::

    profile = profile_device(quick=True)          # a second or two
    json.dumps(profile.to_dict())                 # goes to the server at registration

The tier policy — used by HierarchyFL, the simulator (``--fleet``) and MQTT registration — is
:func:`choose_tier`: the largest tier of a family whose estimated training memory and round time
fit the device's budget::

    tier = choose_tier(profile, spec_template, family_tiers("hierarchy-width"),
                       TierBudget(memory_fraction=0.5, round_seconds=60, samples_per_round=640))

Cost model (estimates, documented so that they can be argued with):

- **FLOPs.** One forward pass of one sample is traced with hooks; every ``Conv2d`` adds
  ``out.numel() * in_channels/groups * kh * kw`` multiply-accumulates (MACs) and every
  ``Linear`` ``out.numel() * in_features``. Training one sample costs ``6 * MACs`` FLOPs
  (forward 2·MACs, backward twice the forward: gradients w.r.t. inputs and weights).
- **Training memory** (:func:`estimate_training_memory_mb`)::

      bytes = P * 4 * (2 + k)  +  B * (A + I)  +  B * 4 * (C + L)

  with P the parameter count (weights and gradients, float32), k the optimizer's state tensors
  per parameter (plain SGD 0, SGD with momentum 1, Adam 2), B the batch size, A the bytes of
  activations autograd saves for the backward pass per sample — *measured* by running a
  forward pass under ``torch.autograd.graph.saved_tensors_hooks`` and summing the distinct
  non-parameter tensors saved — I the input bytes per sample, C the number of classes and L the
  largest single activation (the gradient buffer that is live during backward). Buffers and the
  Python/torch runtime itself are not part of it: that is what ``memory_fraction`` leaves room for.
- **Round time** (:func:`estimate_round_seconds`): ``samples * 6 * MACs / train_gflops`` where
  ``train_gflops`` is the profile's measured *effective* training throughput: the images/s of a
  small reference CNN trained forward+backward, times that CNN's ``6 * MACs``. Large models run
  somewhat more efficiently than the small reference CNN, so the estimate errs on the slow side.

The compute benchmark runs on the CPU (edgefl trains on the CPU); a CUDA device is recorded in
the profile but not benchmarked. Without torch (the base install of a device that only runs
exported models) the profile still detects the device and measures matmul throughput with numpy;
its training fields stay 0 and ``source`` says so. Torch is imported only where it is used.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import platform
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgefl.errors import ConfigError

if TYPE_CHECKING:
    from torch import nn

    from edgefl.models import ModelSpec

log = logging.getLogger(__name__)

OPTIMIZER_STATES = {"sgd": 0, "sgd-momentum": 1, "adam": 2}
BYTES = 4  # float32


# --- the profile ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceProfile:
    """What a device is and how fast it trains. JSON-safe via :meth:`to_dict`/:meth:`from_dict`.

    - ``kind``: "raspberry-pi", "jetson", "cuda-host" or "cpu".
    - ``board``: the device-tree model string (Raspberry Pi, Jetson), else None.
    - ``accelerator``: e.g. "cuda:NVIDIA H100 80GB HBM3", "jetson:Orin Nano (no CUDA torch)" or None.
    - ``matmul_gflops``: float32 matmul throughput on the CPU threads training uses.
    - ``train_images_per_s``/``train_gflops``: the reference CNN trained forward+backward
      (32×32×3 images, batch 32); ``train_gflops`` is what round-time estimates divide by.
    - ``source``: "measured" for :func:`profile_device`, or where a reference profile's numbers
      come from.
    """

    name: str
    arch: str
    cpu_model: str
    cores: int
    ram_total_mb: int
    ram_available_mb: int
    kind: str = "cpu"
    board: str | None = None
    accelerator: str | None = None
    accelerator_memory_mb: int | None = None
    jetson_release: str | None = None
    os: str = ""
    python: str = ""
    torch: str = ""
    threads: int = 1
    matmul_gflops: float = 0.0
    train_images_per_s: float = 0.0
    train_gflops: float = 0.0
    source: str = "measured"

    def __post_init__(self) -> None:
        for name in ("cores", "ram_total_mb", "ram_available_mb", "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigError(
                    f"device profile {self.name!r}: {name} must be a non-negative number, got {value!r}"
                )
            object.__setattr__(self, name, int(value))
        for name in ("matmul_gflops", "train_images_per_s", "train_gflops"):
            value = float(getattr(self, name))
            if not math.isfinite(value) or value < 0:
                raise ConfigError(
                    f"device profile {self.name!r}: {name} must be finite and >= 0, got {value!r}"
                )
            object.__setattr__(self, name, value)
        if self.ram_available_mb > self.ram_total_mb:
            raise ConfigError(
                f"device profile {self.name!r}: ram_available_mb ({self.ram_available_mb}) exceeds "
                f"ram_total_mb ({self.ram_total_mb})"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeviceProfile:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown device profile fields: {', '.join(unknown)}")
        missing = sorted(
            n
            for n in ("name", "arch", "cpu_model", "cores", "ram_total_mb", "ram_available_mb")
            if n not in data
        )
        if missing:
            raise ConfigError(f"device profile is missing fields: {', '.join(missing)}")
        return cls(**data)


# --- detection (root injectable so that tests can fake /proc and /etc) -----------------------


def _read(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8", "replace").replace("\x00", "").strip() or None
    except OSError:
        return None


def read_board(root: Path | str = "/") -> str | None:
    """The device-tree model ("Raspberry Pi 4 Model B Rev 1.4", "NVIDIA Jetson Orin Nano …")."""
    root = Path(root)
    return _read(root / "proc/device-tree/model") or _read(
        root / "sys/firmware/devicetree/base/model"
    )


def jetson_release(root: Path | str = "/") -> str | None:
    """The L4T release line of a Jetson ("R32 (release), REVISION: 7.1"), else None."""
    text = _read(Path(root) / "etc/nv_tegra_release")
    if text is None:
        return None
    line = text.splitlines()[0].lstrip("# ").strip()
    return ", ".join(part.strip() for part in line.split(",")[:2]) or None


def detect_kind(root: Path | str = "/", *, cuda: bool | None = None) -> tuple[str, str | None]:
    """(kind, board): "jetson", "raspberry-pi", "cuda-host" or "cpu", and the device-tree model."""
    board = read_board(root)
    if jetson_release(root) or (board and "jetson" in board.lower()):
        return "jetson", board
    if board and "raspberry pi" in board.lower():
        return "raspberry-pi", board
    if cuda if cuda is not None else _cuda_available():
        return "cuda-host", board
    return "cpu", board


def cpu_model(root: Path | str = "/") -> str:
    """CPU model name from /proc/cpuinfo ("model name", or "Model"/"Hardware" on ARM boards)."""
    text = _read(Path(root) / "proc/cpuinfo") or ""
    found: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip():
            found.setdefault(key.strip().lower(), value.strip())
    for key in ("model name", "cpu model", "hardware", "model", "processor"):
        value = found.get(key)
        if value and not value.isdigit():
            return value
    return platform.processor() or platform.machine() or "unknown"


def memory_mb(root: Path | str = "/") -> tuple[int, int]:
    """(total, available) RAM in MiB from /proc/meminfo; psutil where there is none."""
    text = _read(Path(root) / "proc/meminfo")
    if text:
        values = {}
        for line in text.splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                values[key.strip()] = int(parts[0]) // 1024  # kB → MiB
        if "MemTotal" in values:
            total = values["MemTotal"]
            return total, min(total, values.get("MemAvailable", values.get("MemFree", total)))
    import psutil

    vm = psutil.virtual_memory()
    return vm.total // 2**20, vm.available // 2**20


def _torch():
    """The torch module, or None on the base install."""
    try:
        import torch
    except ModuleNotFoundError:
        return None
    return torch


def _cuda_available() -> bool:
    torch = _torch()
    return torch is not None and torch.cuda.is_available()


def _accelerator(kind: str, board: str | None) -> tuple[str | None, int | None]:
    if _cuda_available():
        import torch

        props = torch.cuda.get_device_properties(0)
        return f"cuda:{props.name}", props.total_memory // 2**20
    if kind == "jetson":
        return f"jetson:{board or 'unknown'} (no CUDA torch)", None
    return None, None


# --- compute benchmark ---------------------------------------------------------------------


def _reference_cnn() -> nn.Module:
    """The fixed small CNN whose training throughput calibrates round-time estimates."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(64, 10),
    )  # fmt: skip


REFERENCE_INPUT = (3, 32, 32)
REFERENCE_BATCH = 32


def _step_seconds(fn, seconds: float, min_reps: int = 5) -> float:
    """A fast-quantile time of one call of ``fn``, over about ``seconds`` of calls.

    The first calls in a process pay for allocations and kernel selection, and a shared machine
    stalls some calls; the 25th percentile of the per-call times measures what the device can
    do rather than how busy it happened to be.
    """
    for _ in range(3):  # warm-up
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_reps or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= 10_000:
            break
    times.sort()
    return max(times[len(times) // 4], 1e-9)


def benchmark_matmul(seconds: float = 0.5, n: int = 512) -> float:
    """float32 GFLOP/s of n×n matmuls on the CPU (torch's; numpy's BLAS without torch)."""
    torch = _torch()
    if torch is None:
        import numpy as np

        rng = np.random.default_rng(0)
        a, b = rng.standard_normal((n, n), np.float32), rng.standard_normal((n, n), np.float32)
        return 2 * n**3 / _step_seconds(lambda: a @ b, seconds) / 1e9
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / _step_seconds(lambda: torch.mm(a, b), seconds) / 1e9


def benchmark_training(seconds: float = 1.0) -> tuple[float, float]:
    """(images/s, effective training GFLOP/s) of the reference CNN, forward+backward+SGD step."""
    import torch
    from torch import nn

    gen = torch.Generator().manual_seed(0)
    model = _reference_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.rand(REFERENCE_BATCH, *REFERENCE_INPUT, generator=gen)
    y = torch.randint(0, 10, (REFERENCE_BATCH,), generator=gen)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    images_per_s = REFERENCE_BATCH / _step_seconds(step, seconds)
    macs = trace_module(model, REFERENCE_INPUT).macs
    return images_per_s, images_per_s * 6 * macs / 1e9


def profile_device(
    quick: bool = False, *, name: str | None = None, root: Path | str = "/"
) -> DeviceProfile:
    """Detect this device and measure it: about 1.5 s of benchmarks (0.4 s with ``quick``)."""
    kind, board = detect_kind(root)
    accelerator, acc_mem = _accelerator(kind, board)
    total, available = memory_mb(root)
    scale = 0.25 if quick else 1.0
    torch = _torch()
    images_per_s, train_gflops = benchmark_training(1.0 * scale) if torch is not None else (0.0, 0.0)
    return DeviceProfile(
        name=name or platform.node() or "device",
        arch=platform.machine(),
        cpu_model=cpu_model(root),
        cores=os.cpu_count() or 1,
        ram_total_mb=total,
        ram_available_mb=available,
        kind=kind,
        board=board,
        accelerator=accelerator,
        accelerator_memory_mb=acc_mem,
        jetson_release=jetson_release(root),
        os=f"{platform.system()} {platform.release()}",
        python=platform.python_version(),
        torch=torch.__version__ if torch is not None else "",
        threads=torch.get_num_threads() if torch is not None else 1,
        matmul_gflops=round(benchmark_matmul(0.5 * scale), 2),
        train_images_per_s=round(images_per_s, 1),
        train_gflops=round(train_gflops, 3),
        source="measured" + (" (quick)" if quick else "") + ("" if torch is not None else " (no torch: matmul only)"),
    )


# --- model cost ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelCost:
    """Per-sample costs of one model, from one traced forward pass."""

    parameters: int
    macs: int  # multiply-accumulates of one forward pass of one sample
    activation_bytes: int  # tensors autograd saves for backward, per sample
    largest_activation_bytes: int  # the largest single module output, per sample
    input_bytes: int
    num_classes: int


def trace_module(model: nn.Module, in_shape: tuple[int, ...], batch: int = 2) -> ModelCost:
    """Count MACs and measure saved activations of ``model`` on a batch of random inputs.

    ``batch`` is 2, not 1, because BatchNorm refuses a single value per channel in train mode;
    the results are divided back to one sample.
    """
    import torch
    from torch import nn

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    macs = 0
    largest = 0

    def hook(module, inputs, output):
        nonlocal macs, largest
        if isinstance(output, torch.Tensor):
            largest = max(largest, output.numel())
            if isinstance(module, nn.Conv2d):
                kh, kw = module.kernel_size
                macs += output.numel() * (module.in_channels // module.groups) * kh * kw
            elif isinstance(module, nn.Linear):
                macs += output.numel() * module.in_features

    saved: dict[tuple[int, int], int] = {}

    def pack(t: torch.Tensor):
        # One storage saved by several ops (a ReLU output feeding a conv) counts once;
        # parameters are counted with the weights, not as activations.
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[(storage.data_ptr(), storage.nbytes())] = storage.nbytes()
        return t

    handles = [m.register_forward_hook(hook) for m in model.modules() if not list(m.children())]
    was_training = model.training
    model.train()
    try:
        x = torch.rand(batch, *in_shape, requires_grad=False)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(x)
        del out
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return ModelCost(
        parameters=sum(p.numel() for p in model.parameters()),
        macs=macs // batch,
        activation_bytes=sum(saved.values()) // batch,
        largest_activation_bytes=largest * BYTES // batch,
        input_bytes=math.prod(in_shape) * BYTES,
        num_classes=0,
    )


@functools.lru_cache(maxsize=256)
def model_cost(spec: ModelSpec) -> ModelCost:
    """The :class:`ModelCost` of the model ``spec`` describes (cached per spec)."""
    import torch

    from edgefl.models import build_model

    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(0)
        cost = trace_module(build_model(spec), spec.in_shape)
    finally:
        torch.random.set_rng_state(state)  # estimating must not change the caller's random stream
    return dataclasses.replace(cost, num_classes=spec.num_classes)


def training_flops_per_sample(spec: ModelSpec) -> float:
    return 6.0 * model_cost(spec).macs


def estimate_training_memory_mb(
    spec: ModelSpec, batch_size: int, optimizer: str = "sgd-momentum"
) -> float:
    """Estimated peak training memory in MiB (formula in the module docstring)."""
    if optimizer not in OPTIMIZER_STATES:
        raise ConfigError(
            f"unknown optimizer {optimizer!r}; choose one of: {', '.join(OPTIMIZER_STATES)}"
        )
    c = model_cost(spec)
    weights = c.parameters * BYTES * (2 + OPTIMIZER_STATES[optimizer])
    per_sample = (
        c.activation_bytes + c.input_bytes + BYTES * c.num_classes + c.largest_activation_bytes
    )
    return (weights + batch_size * per_sample) / 2**20


def estimate_round_seconds(
    spec: ModelSpec, profile: DeviceProfile, samples_per_round: int
) -> float:
    """Estimated seconds of local training on ``samples_per_round`` samples on ``profile``."""
    if profile.train_gflops <= 0:
        raise ConfigError(f"device profile {profile.name!r} has no measured train_gflops")
    return samples_per_round * training_flops_per_sample(spec) / (profile.train_gflops * 1e9)


# --- the tier policy -----------------------------------------------------------------------


@dataclass(frozen=True)
class TierBudget:
    """How much of a device one round of training may use.

    - ``memory_fraction``: share of the device's available memory (RAM; a discrete CUDA GPU's
      memory where the profile has one) the estimated training memory may take.
    - ``round_seconds``: the local-work time limit per round; None: no time limit.
    - ``batch_size``/``optimizer``: what training uses (memory estimate).
    - ``samples_per_round``: samples trained per round (epochs × shard size, or steps × batch).
    """

    memory_fraction: float = 0.5
    round_seconds: float | None = None
    batch_size: int = 32
    samples_per_round: int = 1000
    optimizer: str = "sgd-momentum"

    def __post_init__(self) -> None:
        if not 0 < self.memory_fraction <= 1:
            raise ConfigError(f"memory_fraction must be in (0, 1], got {self.memory_fraction}")
        if self.round_seconds is not None and self.round_seconds <= 0:
            raise ConfigError(f"round_seconds must be > 0 or None, got {self.round_seconds}")
        if self.batch_size < 1 or self.samples_per_round < 1:
            raise ConfigError("batch_size and samples_per_round must be >= 1")
        if self.optimizer not in OPTIMIZER_STATES:
            raise ConfigError(
                f"unknown optimizer {self.optimizer!r}; choose one of: {', '.join(OPTIMIZER_STATES)}"
            )


def memory_budget_mb(profile: DeviceProfile, budget: TierBudget) -> float:
    memory = profile.ram_available_mb
    if profile.kind == "cuda-host" and profile.accelerator_memory_mb:
        memory = profile.accelerator_memory_mb  # a discrete GPU trains in its own memory
    return budget.memory_fraction * memory


@dataclass(frozen=True)
class TierEstimate:
    tier: str
    memory_mb: float
    round_seconds: float
    fits_memory: bool
    fits_time: bool

    @property
    def fits(self) -> bool:
        return self.fits_memory and self.fits_time


def estimate_tiers(
    profile: DeviceProfile, spec_template: ModelSpec, tiers: list[str], budget: TierBudget
) -> list[TierEstimate]:
    """Memory and round-time estimates of every tier on ``profile`` and whether each fits."""
    limit = memory_budget_mb(profile, budget)
    out = []
    for tier in tiers:
        spec = dataclasses.replace(spec_template, tier=tier)
        memory = estimate_training_memory_mb(spec, budget.batch_size, budget.optimizer)
        seconds = estimate_round_seconds(spec, profile, budget.samples_per_round)
        fits_time = budget.round_seconds is None or seconds <= budget.round_seconds
        out.append(TierEstimate(tier, memory, seconds, memory <= limit, fits_time))
    return out


def choose_tier(
    profile: DeviceProfile,
    spec_template: ModelSpec,
    tiers: list[str],
    budget: TierBudget | None = None,
    *,
    strict: bool = False,
) -> str:
    """The largest of ``tiers`` (ordered small → large) that fits ``budget`` on ``profile``.

    If none fits: the smallest tier with a logged warning, or ConfigError when ``strict``.
    """
    if not tiers:
        raise ConfigError("choose_tier needs at least one tier")
    budget = budget or TierBudget()
    estimates = estimate_tiers(profile, spec_template, tiers, budget)
    fitting = [e.tier for e in estimates if e.fits]
    if fitting:
        return fitting[-1]
    smallest = estimates[0]
    why = (
        f"needs ~{smallest.memory_mb:.0f} MiB of {memory_budget_mb(profile, budget):.0f} MiB allowed"
        if not smallest.fits_memory
        else f"needs ~{smallest.round_seconds:.1f} s per round, limit {budget.round_seconds} s"
    )
    message = f"no tier of {spec_template.family} fits device {profile.name!r}: the smallest ({smallest.tier}) {why}"
    if strict:
        raise ConfigError(message)
    log.warning("%s; using it anyway", message)
    return smallest.tier


# --- reference profiles and fleet files ----------------------------------------------------


@dataclass(frozen=True)
class Fleet:
    """A fleet file loaded: device ids with their profiles, and the fleet's tier budget.

    ``budget`` holds the TierBudget fields the file sets (``memory_fraction``, ``round_seconds``,
    ``samples_per_round``, ...); a run fills in the rest (its batch size, its samples per round).
    """

    devices: tuple[tuple[str, DeviceProfile], ...]
    budget: dict[str, Any]
    path: str = ""

    @property
    def ids(self) -> list[str]:
        return [d for d, _ in self.devices]


def _yaml(path: Path) -> Any:
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"file {path} does not exist") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}") from None


def load_profile(path: Path | str) -> DeviceProfile:
    """A device profile from a YAML (or JSON) file with the fields of :class:`DeviceProfile`."""
    data = _yaml(Path(path))
    if not isinstance(data, dict):
        raise ConfigError(f"device profile {path} must be a mapping of fields")
    try:
        return DeviceProfile.from_dict(data)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


_BUDGET_KEYS = {f.name for f in fields(TierBudget)}


def read_fleet(path: Path | str) -> Fleet:
    """Load a fleet file::

        budget: {memory_fraction: 0.5, round_seconds: 60}     # optional
        devices:
          - {id: pi4, profile: raspberry-pi-4, count: 3}       # → pi4-0, pi4-1, pi4-2
          - {id: laptop, profile: ./x86-laptop.yaml}           # count 1 → laptop

    ``profile`` names a YAML file next to the fleet file (".yaml" may be left out) or holds the
    profile's fields inline.
    """
    path = Path(path)
    data = _yaml(path)
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("devices"), list)
        or not data["devices"]
    ):
        raise ConfigError(f"fleet file {path} needs a non-empty 'devices' list")
    unknown = sorted(set(data) - {"budget", "devices", "description"})
    if unknown:
        raise ConfigError(f"fleet file {path}: unknown keys {', '.join(unknown)}")
    budget = dict(data.get("budget") or {})
    bad = sorted(set(budget) - _BUDGET_KEYS)
    if bad:
        raise ConfigError(f"fleet file {path}: unknown budget keys {', '.join(bad)}")
    TierBudget(**budget)  # validate now, not in the middle of a run
    devices: list[tuple[str, DeviceProfile]] = []
    for entry in data["devices"]:
        if not isinstance(entry, dict) or "id" not in entry or "profile" not in entry:
            raise ConfigError(
                f"fleet file {path}: each device needs 'id' and 'profile', got {entry!r}"
            )
        count = entry.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ConfigError(
                f"fleet file {path}: count of {entry['id']!r} must be a positive integer"
            )
        ref = entry["profile"]
        if isinstance(ref, dict):
            profile = DeviceProfile.from_dict({"name": str(entry["id"]), **ref})
        else:
            file = path.parent / str(ref)
            if not file.suffix:
                file = file.with_suffix(".yaml")
            profile = load_profile(file)
        for k in range(count):
            devices.append((str(entry["id"]) if count == 1 else f"{entry['id']}-{k}", profile))
    ids = [d for d, _ in devices]
    duplicates = sorted({d for d in ids if ids.count(d) > 1})
    if duplicates:
        raise ConfigError(f"fleet file {path}: duplicate device ids {', '.join(duplicates)}")
    return Fleet(tuple(devices), budget, str(path))


def load_fleet(path: Path | str) -> list[tuple[str, DeviceProfile]]:
    """The (device_id, profile) pairs of a fleet file (see :func:`read_fleet`)."""
    return list(read_fleet(path).devices)


def fleet_tiers(
    fleet: Fleet,
    spec_template: ModelSpec,
    tiers: list[str],
    *,
    batch_size: int,
    samples_per_round: dict[str, int],
    optimizer: str = "sgd-momentum",
) -> dict[str, str]:
    """Each device's tier by :func:`choose_tier`, under the fleet's budget and the run's settings.

    The fleet file's ``samples_per_round``, where it sets one, wins over the run's.
    """
    out = {}
    for device_id, profile in fleet.devices:
        budget = TierBudget(
            **{
                "batch_size": batch_size,
                "samples_per_round": samples_per_round[device_id],
                "optimizer": optimizer,
                **fleet.budget,
            }
        )
        out[device_id] = choose_tier(profile, spec_template, tiers, budget)
    return out
