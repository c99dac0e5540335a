"""edgefl.data in memory: the partitioners (IID, Dirichlet, shards, the public carve-out) and
ArrayDataset's batches and subsets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgefl.data import ArrayDataset, DatasetInfo, carve_public, dirichlet_partition, iid_partition
from edgefl.data.partition import label_distribution, partition, shard_partition
from edgefl.errors import ConfigError, UnknownNameError

LABELS = np.random.default_rng(0).permutation(np.arange(1000) % 10)  # 100 per class


SCHEME_ARGS = {
    "iid": {},
    "dirichlet": {"alpha": 0.5},
    "shards": {"classes_per_client": 2},
}


def class_sets(labels, parts):
    return [set(np.unique(labels[p]).tolist()) for p in parts]


@pytest.mark.parametrize("scheme", SCHEME_ARGS)
def test_partition_is_disjoint_sorted_and_covers_every_index(scheme):
    parts = partition(LABELS, 20, scheme, seed=1, **SCHEME_ARGS[scheme])

    assert len(parts) == 20
    assert all(p.dtype == np.int64 and np.all(np.diff(p) > 0) for p in parts)
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(LABELS.size))


@pytest.mark.parametrize("scheme", SCHEME_ARGS)
def test_partition_depends_only_on_the_seed(scheme):
    first = partition(LABELS, 20, scheme, seed=3, **SCHEME_ARGS[scheme])
    again = partition(LABELS, 20, scheme, seed=3, **SCHEME_ARGS[scheme])
    other = partition(LABELS, 20, scheme, seed=4, **SCHEME_ARGS[scheme])

    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_iid_sizes_differ_by_at_most_one():
    parts = iid_partition(103, 10, seed=0)

    assert sorted({p.size for p in parts}) == [10, 11]


def test_dirichlet_gives_every_client_min_size():
    unconstrained = dirichlet_partition(LABELS, 20, alpha=0.1, seed=0, min_size=0)
    constrained = dirichlet_partition(LABELS, 20, alpha=0.1, seed=0, min_size=15)

    assert min(p.size for p in unconstrained) < 15  # so the constraint had work to do
    assert min(p.size for p in constrained) >= 15


def test_dirichlet_gives_up_with_advice_when_min_size_cannot_be_met():
    # 10 clients x 20 = all 200 samples: only a perfectly even split would do.
    labels = np.arange(200) % 10

    with pytest.raises(ConfigError, match="lower min_size or raise alpha"):
        dirichlet_partition(labels, 10, alpha=0.05, seed=0, min_size=20)


def test_smaller_alpha_gives_more_label_skew():
    def mean_top_class_share(alpha):
        counts = label_distribution(LABELS, dirichlet_partition(LABELS, 10, alpha, seed=0), 10)
        return (counts.max(axis=1) / counts.sum(axis=1)).mean()

    skewed, even = mean_top_class_share(0.1), mean_top_class_share(100.0)

    assert skewed > 0.5
    assert even < 0.2  # uniform would be 0.1
    assert skewed > even + 0.3


@pytest.mark.parametrize("k", [1, 2, 5, 10])
def test_shards_give_each_client_exactly_k_classes(k):
    parts = shard_partition(LABELS, 20, classes_per_client=k, seed=0)

    assert [len(s) for s in class_sets(LABELS, parts)] == [k] * 20


def test_shards_with_fewer_shards_than_classes_use_whole_classes():
    parts = shard_partition(LABELS, 3, classes_per_client=2, seed=0)

    counts = label_distribution(LABELS, parts, 10)
    used = counts.sum(axis=0) > 0
    assert used.sum() == 6
    assert np.all(counts.sum(axis=0)[used] == 100)  # every sample of a used class is handed out
    assert [len(s) for s in class_sets(LABELS, parts)] == [2, 2, 2]


def test_shards_pair_classes_at_random():
    # Dealing sorted shards round-robin would give only 5 distinct pairs for 100 clients.
    parts = shard_partition(LABELS, 100, classes_per_client=2, seed=0)

    pairs = {frozenset(s) for s in class_sets(LABELS, parts)}
    assert len(pairs) > 20


def test_carve_public_is_stratified_and_disjoint_from_the_rest():
    labels = np.repeat(np.arange(5), [100, 200, 300, 400, 1000])  # imbalanced, N = 2000

    public, rest = carve_public(labels, 0.05, seed=0)

    assert public.size == 100
    expected = np.array([100, 200, 300, 400, 1000]) * 0.05
    assert np.all(np.abs(np.bincount(labels[public], minlength=5) - expected) <= 1)
    assert np.intersect1d(public, rest).size == 0
    assert np.array_equal(np.sort(np.concatenate([public, rest])), np.arange(labels.size))


def test_carve_public_unstratified_has_the_requested_size():
    public, rest = carve_public(LABELS, 0.01, seed=0, stratified=False)

    assert (public.size, rest.size) == (10, 990)
    assert np.intersect1d(public, rest).size == 0


def test_label_distribution_counts_each_clients_labels():
    labels = np.array([0, 0, 1, 2, 2, 2])
    parts = [np.array([0, 2]), np.array([1, 3, 4, 5])]

    counts = label_distribution(labels, parts, num_classes=4)

    assert counts.tolist() == [[1, 1, 0, 0], [1, 0, 3, 0]]


@pytest.mark.parametrize(
    "call",
    [
        lambda: dirichlet_partition(LABELS, 10, alpha=0.0, seed=0),
        lambda: dirichlet_partition(LABELS, 10, alpha=-1.0, seed=0),
        lambda: shard_partition(LABELS, 10, classes_per_client=0, seed=0),
        lambda: shard_partition(LABELS, 10, classes_per_client=11, seed=0),
        lambda: iid_partition(100, 0, seed=0),
        lambda: iid_partition(100, 101, seed=0),
        lambda: partition(LABELS, 10, "dirichlet", seed=0),
        lambda: carve_public(LABELS, 0.0, seed=0),
        lambda: carve_public(LABELS, 1.0, seed=0),
    ],
    ids=[
        "alpha0",
        "alpha<0",
        "k0",
        "k>classes",
        "clients0",
        "clients>N",
        "no-alpha",
        "frac0",
        "frac1",
    ],
)
def test_invalid_partition_settings_raise_config_error(call):
    with pytest.raises(ConfigError):
        call()


def test_unknown_scheme_lists_the_choices():
    with pytest.raises(UnknownNameError, match="iid, dirichlet, shards"):
        partition(LABELS, 10, "pathological", seed=0)


def indexed_dataset(n: int) -> ArrayDataset:
    """Sample i carries i in its first two pixels, and the extremes 0 and 255 elsewhere."""
    info = DatasetInfo("indexed", 10, (1, 2, 2), (0.5,), (0.5,), tuple("abcdefghij"))
    x = np.zeros((n, 1, 2, 2), np.uint8)
    x[:, 0, 0, 0], x[:, 0, 0, 1], x[:, 0, 1, 1] = np.arange(n) // 256, np.arange(n) % 256, 255
    return ArrayDataset.from_numpy(x, np.arange(n) % 10, info)


def sample_ids(xb: torch.Tensor) -> np.ndarray:
    pixels = (xb * 255).round().to(torch.int64)
    return (pixels[:, 0, 0, 0] * 256 + pixels[:, 0, 0, 1]).numpy()


def test_batches_cover_every_sample_once_in_range():
    data = indexed_dataset(300)

    batches = list(data.batches(64, shuffle=True, rng=np.random.default_rng(0)))

    assert [len(yb) for _, yb in batches] == [64, 64, 64, 64, 44]
    ids = np.concatenate([sample_ids(xb) for xb, _ in batches])
    assert np.array_equal(np.sort(ids), np.arange(300))
    assert not np.array_equal(ids, np.arange(300))
    assert all(np.array_equal(yb.numpy(), sample_ids(xb) % 10) for xb, yb in batches)
    assert all(
        xb.dtype == torch.float32 and xb.min() == 0.0 and xb.max() == 1.0 for xb, _ in batches
    )


def test_batches_are_reproducible_from_the_rng_seed():
    data = indexed_dataset(300)

    def order(seed):
        return np.concatenate(
            [
                yb.numpy()
                for _, yb in data.batches(50, shuffle=True, rng=np.random.default_rng(seed))
            ]
        )

    assert np.array_equal(order(5), order(5))
    assert not np.array_equal(order(5), order(6))


def test_batches_unshuffled_drop_last_and_shuffle_without_rng():
    data = indexed_dataset(130)

    kept = list(data.batches(50, shuffle=False, drop_last=True))

    assert np.array_equal(np.concatenate([sample_ids(xb) for xb, _ in kept]), np.arange(100))
    with pytest.raises(ConfigError, match="needs rng"):
        data.batches(50, shuffle=True)


def test_subset_copies_the_rows_it_takes():
    data = indexed_dataset(20)

    part = data.subset(np.array([3, 17, 5]))
    part.x.zero_()

    assert part.y.tolist() == [3, 7, 5]
    assert sample_ids(data.images(np.array([3, 17, 5]))).tolist() == [3, 17, 5]
    assert data.class_counts().tolist() == [2] * 10


def test_array_dataset_rejects_labels_out_of_range():
    info = DatasetInfo("tiny", 2, (1, 1, 1), (0.5,), (0.5,), ("a", "b"))

    with pytest.raises(ConfigError, match=r"labels must lie in \[0, 2\)"):
        ArrayDataset(torch.zeros(2, 1, 1, 1, dtype=torch.uint8), torch.tensor([0, 2]), info)
