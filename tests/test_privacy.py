"""Differential privacy: the noise is what its calibration says, the ledger is the library's own
composition, clipping bounds every contribution, and the settings are checked (in runs:
tests/test_privacy_runs.py)."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting import pld, rdp

from edgefl.data import ArrayDataset, dataset_info
from edgefl.errors import ConfigError
from edgefl.privacy import SENSITIVITY, ClassStats, PrivacySettings, Release, split_privacy_options
from edgefl.privacy.accountant import Ledger, adaptive_update_noise, calibrate_noise, epsilon_of
from edgefl.privacy.mechanisms import (
    PRESENT_SIGMAS,
    class_sums,
    clip_rows,
    clip_whole,
    private_class_stats,
    private_whole,
    update_norm,
)
from edgefl.runtime.setup import resolve_method
from tests.privacy_cases import STD_TOLERANCE, fedavg_assembly

# --- noise: its empirical standard deviation is its calibration -----------------------------------


def test_the_noise_on_a_clipped_update_has_the_calibrated_std():
    # Prepare: an update of 200 000 coordinates well inside the clip, and its reference
    rng = np.random.default_rng(1234)
    received = {"w/a": rng.normal(size=(400, 500)).astype(np.float32)}
    update = {"w/a": received["w/a"] + 1e-4}
    z, clip = 1.3, 0.7
    # Execute
    out = private_whole(update, Release(whole=("w/",)), received, clip, z, np.random.default_rng(7))
    # Assert: the noise (output minus the unclipped update, float32 rounding aside) has std z·2C
    noise = out["w/a"].astype(np.float64) - update["w/a"].astype(np.float64)
    assert out["w/a"].dtype == np.float32
    assert abs(noise.std() / (z * SENSITIVITY * clip) - 1) < STD_TOLERANCE
    assert abs(noise.mean()) < 5 * z * SENSITIVITY * clip / math.sqrt(noise.size)


def test_the_noise_on_class_sums_and_counts_has_the_calibrated_std():
    # Prepare: exact sums and counts of 10 classes × 20 000 dims; every class far above the
    # threshold
    stats = ClassStats(("feat",), reduce="sum", counts="count")
    sums = {"feat": np.zeros((10, 20_000))}
    counts = np.full(10, 1e6)
    z, clip = 0.8, 2.5
    # Execute: 50 000 draws of the counts (one call's 10 are too few to measure a std)
    dtypes = {"feat": np.float64, "count": np.float64}
    out = private_class_stats(sums, counts, stats, clip, z, np.random.default_rng(11), dtypes)
    count_noise = np.concatenate(
        [
            private_class_stats({"feat": np.zeros((10, 1))}, counts, stats, clip, z,
                                np.random.default_rng(s), {"count": np.float64})["count"]
            - 1e6
            for s in range(5000)
        ]
    )
    # Assert: sums noised with std z·2C, counts with z·2
    assert abs(out["feat"].std() / (z * SENSITIVITY * clip) - 1) < STD_TOLERANCE
    assert abs(count_noise.std() / (z * SENSITIVITY) - 1) < STD_TOLERANCE


def test_a_class_reported_absent_carries_no_row_and_no_count():
    # Prepare: class 0 held by 1000 samples, class 1 by none
    stats = ClassStats(("proto",), reduce="mean", classes="proto_classes")
    sums = {"proto": np.array([[1000.0, 0.0], [0.0, 0.0]])}
    # Execute
    out = private_class_stats(
        sums, np.array([1000.0, 0.0]), stats, 1.0, 1e-3, np.random.default_rng(0), {}
    )
    # Assert: only class 0 reported, its mean close to the true mean
    assert out["proto_classes"].tolist() == [0]
    np.testing.assert_allclose(out["proto"], [[1.0, 0.0]], atol=1e-4)
    assert PRESENT_SIGMAS * 1e-3 * SENSITIVITY < 1  # (the threshold is then 1 sample)


def test_noisy_class_means_are_projected_onto_the_clip_ball_never_farther_from_the_truth():
    # Prepare: two blocks of per-sample vectors clipped to C, their exact per-class sums, and noise
    # far larger than the means (z = 20: the mean of 30 samples is mostly noise)
    rng = np.random.default_rng(5)
    stats = ClassStats(("logit", "feat"), reduce="mean", counts="count")
    clip, z = 3.0, 20.0
    labels = rng.integers(0, 4, 400)
    vectors = clip_rows(rng.normal(size=(400, 64)), clip)
    sums = {"logit": np.zeros((4, 4)), "feat": np.zeros((4, 60))}
    np.add.at(sums["logit"], labels, vectors[:, :4])
    np.add.at(sums["feat"], labels, vectors[:, 4:])
    counts = np.bincount(labels, minlength=4).astype(np.float64)
    true = np.concatenate([sums["logit"], sums["feat"]], 1) / counts[:, None]
    # Execute
    dtypes = {"logit": np.float64, "feat": np.float64}
    out = private_class_stats(sums, counts, stats, clip, z, np.random.default_rng(0), dtypes)
    # Assert: every reported mean (both blocks together) within the ball, and no closer to the
    # truth without the projection (the same noise, drawn again from the same seed)
    released = np.concatenate([out["logit"], out["feat"]], 1)
    reported = out["count"] > 0
    assert reported.any()
    assert np.all(np.linalg.norm(released, axis=1) <= clip * (1 + 1e-9))
    raw_rng = np.random.default_rng(0)
    noisy_counts = counts + raw_rng.normal(0.0, z * SENSITIVITY, 4)
    raw = np.concatenate(
        [
            (sums[b] + raw_rng.normal(0.0, z * SENSITIVITY * clip, sums[b].shape))
            / np.maximum(noisy_counts, 1.0)[:, None]
            for b in ("logit", "feat")
        ],
        1,
    )
    # the noise left the ball far behind
    assert np.linalg.norm(raw[reported], axis=1).min() > 2 * clip
    for i in np.flatnonzero(reported):
        assert np.linalg.norm(released[i] - true[i]) <= np.linalg.norm(raw[i] - true[i]) + 1e-9


# --- clipping bounds every contribution
# ------------------------------------------------------------


def test_clipping_bounds_a_whole_update_and_keeps_a_small_one():
    received = {"w/a": np.zeros(3, np.float32), "w/n": np.array(7, np.int64)}
    big = {"w/a": np.array([300.0, -400.0, 0.0], np.float32), "w/n": np.array(9, np.int64)}
    small = {"w/a": np.array([0.3, 0.4, 0.0], np.float32), "w/n": np.array(9, np.int64)}
    release = Release(whole=("w/",))
    clipped = clip_whole(big, release, received, 1.0)
    assert update_norm(clipped, release, received) == pytest.approx(1.0)
    np.testing.assert_allclose(clipped["w/a"], [0.6, -0.8, 0.0])
    assert int(clipped["w/n"]) == 9  # integer arrays (step counters) are not noised or clipped
    np.testing.assert_allclose(clip_whole(small, release, received, 1.0)["w/a"], small["w/a"])


def test_clipping_bounds_every_per_class_contribution_against_an_adversarial_sample():
    # Prepare: per-sample vectors that are the images themselves (a model that leaks them), and a
    # neighbour dataset whose first image is replaced by a saturated one of another class
    info = dataset_info("synthetic")
    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, 40, (64, *info.in_shape), dtype=torch.uint8, generator=g)
    y = torch.randint(0, info.num_classes, (64,), generator=g)
    data = ArrayDataset(x, y, info)
    x2, y2 = x.clone(), y.clone()
    x2[0], y2[0] = 255, (int(y[0]) + 3) % info.num_classes
    neighbour = ArrayDataset(x2, y2, info)
    stats = ClassStats(("a", "b"), counts="count")

    def vectors(batch: torch.Tensor) -> dict[str, torch.Tensor]:
        flat = batch.flatten(1)
        return {"a": flat, "b": flat[:, :5] * 1000}

    clip = 2.0
    # Execute
    s1, n1 = class_sums(vectors, torch.nn.Identity(), data, stats, info.num_classes, clip)
    s2, n2 = class_sums(vectors, torch.nn.Identity(), neighbour, stats, info.num_classes, clip)
    # Assert: each class row moves by at most C, the whole (sums/C, counts) by at most 2
    rows = np.sqrt(sum(((s1[b] - s2[b]) ** 2).sum(1) for b in stats.blocks))
    assert rows.max() <= clip * (1 + 1e-9)
    assert np.sort(rows)[-2:].min() > 0.5 * clip  # the adversary's two classes both moved
    total = math.sqrt(
        float(sum(((s1[b] - s2[b]) ** 2).sum() for b in stats.blocks)) / clip**2
        + float(((n1 - n2) ** 2).sum())
    )
    assert total <= SENSITIVITY * (1 + 1e-9)


# --- the accountant is the library's composition
# ---------------------------------------------------


@pytest.mark.parametrize(
    ("z", "k", "delta"), [(1.0, 10, 1e-5), (2.85, 20, 1e-5), (0.7, 1, 1e-6), (5.0, 100, 1e-5)]
)
def test_the_ledger_agrees_with_the_librarys_composition_of_k_gaussian_mechanisms(z, k, delta):
    # Prepare: the library's own accountants for the Gaussian mechanism composed k times
    library = rdp.RdpAccountant()
    library.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), k))
    tight = pld.PLDAccountant()
    tight.compose(dp_accounting.GaussianDpEvent(z), k)
    rho = k / (2 * z**2)  # zCDP of k Gaussians: a closed-form upper bound
    # Execute: one device spends one mechanism per round for k rounds
    ledger = Ledger(z, delta, math.inf)
    for _ in range(k):
        ledger.spend("d00", 1)
    # Assert
    assert ledger.epsilon("d00") == pytest.approx(library.get_epsilon(delta), rel=1e-12)
    assert (
        tight.get_epsilon(delta)
        <= ledger.epsilon("d00")
        <= rho + 2 * math.sqrt(rho * math.log(1 / delta))
    )


def test_calibration_spends_the_budget_over_the_rounds_and_no_more():
    for target, count in [(1.0, 40), (4.0, 10), (8.0, 20)]:
        z = calibrate_noise(target, 1e-5, count)
        assert epsilon_of(z, count, 1e-5) <= target
        assert epsilon_of(z * 0.99, count, 1e-5) > target  # a 1 % smaller noise would overspend


def test_adaptive_clipping_splits_the_noise_as_andrew_et_al():
    z_update = adaptive_update_noise(1.0, 5.0)
    assert (z_update**-2 + (2 * 5.0) ** -2) ** -0.5 == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="count noise"):
        adaptive_update_noise(3.0, 1.0)


# --- settings and refusals
# ---------------------------------------------------------------------------


def test_privacy_options_are_split_from_the_methods_own_and_validated():
    own, s = split_privacy_options(
        {"lam": "2", "dp": "local", "dp_target_epsilon": "8", "dp_clip": "3"}
    )
    assert own == {"lam": "2"}
    assert (s.mode, s.target_epsilon, s.clip, s.delta) == ("local", 8.0, 3.0, 1e-5)
    assert split_privacy_options(s.as_options())[1] == s
    with pytest.raises(ConfigError, match="budget"):
        PrivacySettings(mode="local")
    with pytest.raises(ConfigError, match="dp_delta"):
        PrivacySettings(mode="local", target_epsilon=1, delta=2)
    with pytest.raises(ConfigError, match="central"):
        PrivacySettings(mode="local", target_epsilon=1, adaptive_quantile=0.5)


def test_central_dp_refuses_a_method_that_sends_statistics():
    with pytest.raises(ConfigError, match="dp=local"):
        resolve_method("felo", {"dp": "central", "dp_target_epsilon": "8"})
    with pytest.raises(ConfigError, match="point"):
        resolve_method("velo", {"dp": "local", "dp_target_epsilon": "8"})


def test_central_dp_refuses_a_robust_aggregator(tmp_path):
    from edgefl.runtime.setup import build_server

    run, fleet = fedavg_assembly(tmp_path, dp="central", dp_target_epsilon=8, aggregator="median")
    with pytest.raises(ConfigError, match="aggregator=mean"):
        build_server(run.method, run.server_context(fleet))
