"""Where a party's data come from (``edgefl train --data``), validated by pydantic."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import ConfigDict, ValidationError, field_validator, model_validator
from pydantic.dataclasses import dataclass

from edgefl.errors import ConfigError
from edgefl.runtime.derived import from_config

if TYPE_CHECKING:
    from edgefl.config import RunConfig


@dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class DataSpec:
    """Where a party's data come from: a dataset and, for simulated fleets, demos and benchmarks,
    the partition of it that ``edgefl simulate`` makes (same subsampling, server's share and
    partitioner), of which a device takes one shard.

    As text (``edgefl train --data``)::

        NAME[:shard=I/N,partition=iid|dirichlet|shards,alpha=A,k=K,seed=S,min_size=M,
              train_samples=T,test_samples=U,eval_samples=E,public=F,dir=PATH]
    """

    dataset: str
    shard: tuple[int, int] | None = None  # (index, count)
    partition: Literal["iid", "dirichlet", "shards"] = "iid"
    alpha: float = 0.5
    classes_per_client: int = 2
    seed: int = 0
    min_size: int = 10
    train_samples: int | None = None
    test_samples: int | None = None
    eval_samples: int = 2000
    public: float | None = None  # None: the method's share (from the assignment)
    data_dir: str | None = None
    validation_samples: int | None = None  # evaluate on training samples held out (tuning runs)

    @field_validator("shard", mode="before")
    @classmethod
    def _shard_text(cls, value):
        """``I/N`` (text) is the pair (I, N)."""
        if isinstance(value, str):
            index, sep, count = value.partition("/")
            return (index, count) if sep else value
        return value

    @model_validator(mode="after")
    def _shard_in_range(self):
        if self.shard is not None and not 0 <= self.shard[0] < self.shard[1]:
            raise ValueError(f"shard {self.shard[0]}/{self.shard[1]}: need 0 <= I < N")
        return self

    @classmethod
    def from_config(cls, cfg: RunConfig, index: int | None = None) -> DataSpec:
        """Shard ``index`` of ``cfg``'s partition (None: the whole partition, every shard)."""
        shard = (0 if index is None else index, cfg.clients)
        return from_config(cls, cfg, shard=shard, public=cfg.public_fraction)

    @classmethod
    def parse(cls, text: str) -> DataSpec:
        """``NAME[:key=value,...]`` (see the class); a mistake names the option and what it
        takes."""
        # a dataset name may itself hold ':' (imagefolder:DIR); options follow the last ':'
        head, sep, tail = text.rpartition(":")
        name, rest = (head, tail) if sep and ("=" in tail or not tail) else (text, "")
        if not name:
            raise ConfigError(f"--data {text!r}: name a dataset, e.g. fashion-mnist:shard=0/6")
        values: dict[str, str] = {}
        for item in filter(None, rest.split(",")):
            key, sep, value = item.partition("=")
            if not sep or key.strip() not in KEYS:
                raise ConfigError(
                    f"--data option {item!r}: use key=value with keys {', '.join(sorted(KEYS))}")
            values[KEYS[key.strip()]] = value.strip()
        try:
            return cls(dataset=name, **values)
        except ValidationError as e:
            raise ConfigError(f"--data {text!r}: {_reason(e)}") from None

    def to_string(self) -> str:
        parts = []
        if self.shard is not None:
            parts.append(f"shard={self.shard[0]}/{self.shard[1]}")
        for key, value in (
            ("partition", self.partition),
            ("alpha", self.alpha),
            ("k", self.classes_per_client),
            ("seed", self.seed),
            ("min_size", self.min_size),
            ("train_samples", self.train_samples),
            ("test_samples", self.test_samples),
            ("eval_samples", self.eval_samples),
            ("public", self.public),
            ("validation_samples", self.validation_samples),
        ):
            if value is not None:
                parts.append(f"{key}={value}")
        if self.data_dir:
            parts.append(f"dir={self.data_dir}")
        return f"{self.dataset}:{','.join(parts)}"


#: The keys of ``--data NAME:key=value,...`` and the field each sets.
KEYS = {
    "shard": "shard", "partition": "partition", "alpha": "alpha", "k": "classes_per_client",
    "classes_per_client": "classes_per_client", "seed": "seed", "min_size": "min_size",
    "train_samples": "train_samples", "test_samples": "test_samples",
    "eval_samples": "eval_samples",
    "public": "public", "dir": "data_dir", "validation_samples": "validation_samples",
}  # fmt: skip
_OPTION = {field: key for key, field in KEYS.items() if key != "classes_per_client"}


def _reason(e: ValidationError) -> str:
    """The first problem, in the words of ``--data``: ``seed='x': Input should be a valid
    integer``."""
    error = e.errors(include_url=False)[0]
    field = next((str(part) for part in error["loc"] if str(part) in _OPTION), None)
    if field is None:  # a check of the whole spec (the shard's range)
        return error["msg"].removeprefix("Value error, ")
    return f"{_OPTION[field]}={error['input']!r}: {error['msg']}"
