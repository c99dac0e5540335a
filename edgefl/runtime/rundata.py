"""A run's data as one party holds them, made in one function (:func:`load_run_data`): the
(subsampled) training set, the evaluation sets, the server's share carved out, then the
partition. A device process given shard *i* of a configuration holds exactly the samples and
the public pool that the simulated device *i* holds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from edgefl.errors import ConfigError

if TYPE_CHECKING:
    from edgefl.data import ArrayDataset, DatasetInfo
    from edgefl.runtime.dataspec import DataSpec


def subsample(data: ArrayDataset, n: int | None, seed: int) -> ArrayDataset:
    if n is None or n >= len(data):
        return data
    idx = np.sort(np.random.default_rng([seed, 99]).choice(len(data), size=n, replace=False))
    return data.subset(idx)


@dataclass
class RunData:
    """A run's data as one party sees it: the (subsampled) training set, the evaluation sets,
    the server's share carved out of the training set, and the partition of the rest."""

    train: ArrayDataset
    evals: dict[str, ArrayDataset]  # "quick" (per-round evaluation) and "test" (the final one)
    public: ArrayDataset | None
    pool: np.ndarray  # indices into ``train`` left to the devices
    parts: list[np.ndarray] | None  # per shard, indices into ``pool``; None: no partition

    @property
    def info(self) -> DatasetInfo:
        return self.train.info

    def shard(self, index: int) -> ArrayDataset:
        if self.parts is None:
            return self.train
        return self.train.subset(self.pool[self.parts[index]])


def evaluation_split(spec: DataSpec, train: ArrayDataset) -> tuple[ArrayDataset, ArrayDataset]:
    """(training pool, evaluation set): the test split, or with ``validation_samples`` a stratified
    validation set carved from the training data (for tuning defaults; the test set is then never
    read)."""
    from edgefl.data import carve_public, load_dataset

    if not spec.validation_samples:
        return train, subsample(
            load_dataset(spec.dataset, "test", spec.data_dir), spec.test_samples, spec.seed + 1)
    if spec.validation_samples >= len(train):
        raise ConfigError(
            f"validation_samples={spec.validation_samples} leaves no training data of {len(train)}")
    val_idx, rest = carve_public(
        train.y.numpy(), spec.validation_samples / len(train), seed=spec.seed + 7)
    return train.subset(rest), train.subset(val_idx)


def load_run_data(spec: DataSpec, public_share: float) -> RunData:
    """The one way a run's data are made. Without a shard in ``spec`` the party holds the whole
    (subsampled) training set and no public pool (a device on its own data)."""
    from edgefl.data import carve_public, load_dataset, partition

    public_share = public_share if spec.public is None else spec.public
    train = subsample(load_dataset(spec.dataset, "train", spec.data_dir), spec.train_samples,
                      spec.seed)
    train, test = evaluation_split(spec, train)
    quick = subsample(test, spec.eval_samples, spec.seed + 2)
    evals = {"quick": quick, "test": test}
    pool = np.arange(len(train))
    if spec.shard is None:
        return RunData(train, evals, None, pool, None)
    labels = train.y.numpy()
    public = None
    if public_share > 0:
        public_idx, pool = carve_public(labels, public_share, seed=spec.seed)
        public = train.subset(public_idx)
    parts = partition(
        labels[pool], spec.shard[1], spec.partition, alpha=spec.alpha,
        classes_per_client=spec.classes_per_client, seed=spec.seed, min_size=spec.min_size,
    )
    return RunData(train, evals, public, pool, parts)
