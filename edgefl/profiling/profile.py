"""The device profile: what a device is and how fast it trains (JSON at registration)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from typing import Any

from edgefl.errors import ConfigError, check_fields


@dataclass(frozen=True)
class DeviceProfile:
    """What a device is and how fast it trains. JSON-safe via :meth:`to_dict`/:meth:`from_dict`.

    - ``kind``: "raspberry-pi", "jetson", "cuda-host" or "cpu".
    - ``board``: the device-tree model string (Raspberry Pi, Jetson), else None.
    - ``accelerator``: e.g. "cuda:NVIDIA H100 80GB HBM3", "jetson:Orin Nano (no CUDA torch)" or
      None.
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
                    f"device profile {self.name!r}: {name} must be a non-negative number, got "
                    f"{value!r}"
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
        required = ("name", "arch", "cpu_model", "cores", "ram_total_mb", "ram_available_mb")
        check_fields(data, (f.name for f in fields(cls)), required, "device profile")
        return cls(**data)
