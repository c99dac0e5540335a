"""The one seam between differential privacy and the methods: wrappers around a device half and a
server half, built by the run assembly when a run's options ask for privacy (``-o dp=local``).

:class:`PrivateDevice` (``dp=local``): the device's uplink is rebuilt by the mechanisms of its
method's :class:`~edgefl.privacy.declare.Release` before it leaves the device; metadata computed
on private data (training loss …) is dropped; a device whose budget is spent refuses to train.

:class:`PrivateServer`: selects only devices with budget left for one more round, records ε per
device in every round record (``privacy``), and with ``dp=central`` clips each device's update,
averages them with equal weights and adds Gaussian noise to the new global model (DP-FedAvg;
adaptive clipping as Andrew et al., 2021).

Both delegate everything else to the method's half, whose code does not change.
"""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgefl.errors import ConfigError, EdgeflError
from edgefl.privacy.accountant import Ledger, adaptive_update_noise, calibrate_noise
from edgefl.privacy.declare import PrivacyBudgetSpent, PrivacySettings, Release
from edgefl.privacy.mechanisms import (
    class_sums,
    clip_whole,
    private_class_stats,
    private_whole,
    update_norm,
    whole_names,
)
from edgefl.wire import Payload

__all__ = ["PrivacyBudgetSpent", "PrivateDevice", "PrivateServer", "check_release"]

log = logging.getLogger(__name__)

#: Seed stream of a device's privacy noise (apart from its training streams).
NOISE_STREAM = 7_777


def noise_rng(seed: Sequence[int] | None) -> np.random.Generator:
    """The generator of privacy noise: from this process's own entropy (``secrets``), or from
    ``seed`` in a simulation that must repeat. Noise drawn from the run seed could be
    regenerated, and subtracted, by whoever knows that seed: the server that assigns it, anyone
    who reads the run's config.json."""
    return np.random.default_rng(list(seed) if seed is not None else secrets.randbits(128))
#: Adaptive clipping's learning rate η_C (geometric update; Andrew et al.'s default).
CLIP_LR = 0.2


def check_release(method: str, release: Release | None, settings: PrivacySettings,
                  sgd_ready: bool = False) -> Release:
    """The method's declaration, if these settings can protect what it sends (else ConfigError).
    ``sgd_ready``: the method's device half declares its local training fit for DP-SGD
    (``DeviceHalf.dp_sgd_ready``)."""
    if release is None:
        raise ConfigError(
            f"{method} does not declare what its uplink reveals (privacy_release): it cannot run "
            "with dp")
    if release.unprotected:
        raise ConfigError(
            f"{method} cannot run with dp: {', '.join(release.unprotected)} {release.reason}")
    if settings.mode == "sgd":
        if release.stats is not None:
            raise ConfigError(
                f"dp=sgd protects the weights a device trains; {method}'s uplink also carries "
                "per-class statistics "
                "of the device's samples, computed outside DP-SGD (use dp=local)"
            )
        if not sgd_ready:
            raise ConfigError(
                f"dp=sgd cannot run {method}: its device's local training is not declared fit "
                "for DP-SGD (one "
                "round of train_local on its own data, a mean of per-sample losses); methods "
                "that are: fedavg, "
                "fedprox, heterofl, hierarchyfl, local"
            )
    if settings.mode == "central" and (
        release.stats is not None or not release.whole or release.reference != "received"
    ):
        raise ConfigError(
            "dp=central protects the weights of one global model that the server averages; "
            f"{method}'s uplink is not that "
            "(use dp=local)"
        )
    return release


def noise_multiplier_for(settings: PrivacySettings, release: Release, rounds: int) -> float:
    """The given noise multiplier, or the smallest that keeps a device that takes part in every
    one of ``rounds`` rounds within the budget."""
    if settings.noise_multiplier is not None:
        return settings.noise_multiplier
    return calibrate_noise(settings.target_epsilon, settings.delta, max(rounds * release.parts, 1))


def central_noise(noise_multiplier: float, clip: float, devices: int,
                  weights: int) -> dict[str, float]:
    """What central DP adds each round to the mean of ``devices`` updates clipped to ``clip``, on
    a model of ``weights`` weights: the noise's std per weight z·C/n (``std``; over C:
    ``std_over_clip``), its norm z·C·√d/n (``norm``; over C: ``norm_over_clip``; the mean of the
    clipped updates is at most C), and the devices a round at which that norm falls to C, z·√d
    (``devices_for_clip``)."""
    std = noise_multiplier * clip / devices
    norm = std * math.sqrt(weights)
    return {"std": std, "std_over_clip": noise_multiplier / devices, "norm": norm,
            "norm_over_clip": norm / clip,
            "devices_for_clip": noise_multiplier * math.sqrt(weights)}


def _diverged(reason: str) -> bool:
    """A device's failure that a diverged model causes: a non-finite or enormous loss or array."""
    return "non-finite" in reason or "not a finite number" in reason


class PrivateDevice:
    """A device half whose uplink is protected on the device (``dp=local``)."""

    #: no model leaves the device un-noised: it keeps its final model (edgefl train --save-model)
    sends_final_model = False

    def __init__(self, inner: Any, settings: PrivacySettings, release: Release, rounds: int, *,
                 repeatable: bool = False):
        self.inner, self.settings, self.release = inner, settings, release
        # noise from the run seed (a simulation); else the device's own entropy
        self.repeatable = repeatable
        self.noise_multiplier = noise_multiplier_for(settings, release, rounds)
        self.ledger = Ledger(self.noise_multiplier, settings.delta, settings.target_epsilon)
        self.received: dict[str, np.ndarray] = {}

    def __getattr__(self, name: str) -> Any:  # model, ctx, expected_downlink, … are the method's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def receive(self, round: int, payload: Payload) -> None:
        # the clip's reference: the server's state, independent of this device's data
        if payload.arrays:
            self.received = {k: np.array(v) for k, v in payload.arrays.items()}
        self.inner.receive(round, payload)

    def finish(self, round: int, payload: Payload) -> None:
        self.inner.finish(round, payload)

    def fit(self, round: int) -> Payload:
        me = self.inner.ctx.device_id
        parts = self.release.parts
        if not self.ledger.can_spend(me, parts):
            raise PrivacyBudgetSpent(
                f"privacy budget spent: ε = {self.ledger.epsilon(me):.3f} of "
                f"{self.settings.target_epsilon:g} "
                f"(one more round would make it {self.ledger.epsilon(me, parts):.3f})"
            )
        up = self.inner.fit(round)
        arrays = self.protect(up.arrays, round)
        epsilon = self.ledger.spend(me, parts)
        return Payload(arrays, {"num_samples": up.meta["num_samples"], "dp_epsilon": epsilon})

    def protect(self, arrays: Mapping[str, np.ndarray], round: int) -> dict[str, np.ndarray]:
        """The uplink arrays as the mechanisms release them. An array the declaration does not
        cover is an error: it would leave the device unprotected."""
        release, s, ctx = self.release, self.settings, self.inner.ctx
        loose = sorted(k for k in arrays if not release.covers(k))
        if loose:
            raise EdgeflError(
                f"uplink arrays {', '.join(loose)} are not covered by the method's privacy "
                "declaration")
        rng = noise_rng([ctx.seed, round, NOISE_STREAM] if self.repeatable else None)
        out = dict(arrays)
        if release.whole:
            out = private_whole(out, release, self.received, s.clip, self.noise_multiplier, rng)
        if release.stats is not None:
            sums, counts = class_sums(
                self.inner.sample_vectors, self.inner.model, ctx.train_data, release.stats,
                ctx.num_classes, s.clip
            )
            dtypes = {k: np.asarray(arrays[k]).dtype for k in release.stat_arrays() if k in arrays}
            out.update(private_class_stats(sums, counts, release.stats, s.clip,
                                           self.noise_multiplier, rng, dtypes))
        return out


class PrivateServer:
    """A server half with a privacy ledger per device, and central DP when ``dp=central``.
    ``aggregator``: the method's rule for combining updates (central DP needs the plain mean)."""

    def __init__(self, inner: Any, settings: PrivacySettings, release: Release, rounds: int, *,
                 repeatable: bool = False, aggregator: str = "mean"):
        self.inner, self.settings, self.release = inner, settings, release
        # central DP's noise from the run seed (a simulation); else entropy
        self.repeatable = repeatable
        # mechanisms a device's round composes (dp=sgd: one round of DP-SGD)
        self.parts = release.parts
        if settings.trains_privately:
            from edgefl.privacy.dpsgd import sgd_ledger

            self.parts, self.ledger = 1, sgd_ledger(settings, inner.ctx, rounds)
            self.noise_multiplier: float | dict[str, float] = {}
        else:
            self.noise_multiplier = noise_multiplier_for(settings, release, rounds)
            self.ledger = Ledger(self.noise_multiplier, settings.delta, settings.target_epsilon)
        self.clip = settings.clip
        self.update_noise = self.noise_multiplier  # z_Δ: the update's share with adaptive clipping
        self.count_std = 0.0
        self.expected_noise = ""  # central DP: what its noise does (state_noise)
        self.nonfinite_round = 0  # the round whose noise left the global model non-finite
        if settings.mode == "central":
            if aggregator != "mean":
                raise ConfigError(
                    "dp=central calibrates its noise to a mean of clipped updates: use "
                    "aggregator=mean")
            server_opt = getattr(inner.ctx, "server_opt", None)
            if server_opt is not None and not server_opt.averages_only:
                raise ConfigError(
                    "dp=central adds its noise to the plain average of clipped updates; "
                    f"--server-opt {server_opt.name} "
                    "would transform it after the noise is calibrated (not supported: use the "
                    "default server step)"
                )
            ctx = inner.ctx
            expected = max(ctx.min_fit, math.ceil(ctx.fraction * len(ctx.fleet)))
            if settings.adaptive_quantile:
                # Andrew et al.'s σ_b = expected/20, raised where a small fleet would leave no
                # noise for the update (their Thm. 1 needs 2σ_b > z)
                self.count_std = max(expected / 20, self.noise_multiplier)
                self.update_noise = adaptive_update_noise(self.noise_multiplier, self.count_std)
            self.expected_noise = self.state_noise(rounds, max(expected, 1))

    def state_noise(self, rounds: int, devices: int) -> str:
        """The noise central DP will add, stated at setup (logged; a warning where its norm
        exceeds the clip, the largest mean update it could hide): z, C, n and what they make."""
        s = self.settings
        state = self.inner.state_dict()
        weights = sum(int(np.size(state[k])) for k in whole_names(state, self.release))
        z = float(self.update_noise)
        noise = central_noise(z, self.clip, devices, weights)
        given = (f"ε = {s.target_epsilon:g} at δ = {s.delta:g} over {rounds} rounds"
                 if s.noise_multiplier is None else "given")
        text = (
            f"central DP: noise multiplier z = {z:.3g} ({given}), clip C = {self.clip:g}, "
            f"n = {devices} devices a round: the server adds noise of std z·C/n = "
            f"{noise['std']:.3g} to each of the model's {weights:,} weights "
            f"({noise['std_over_clip']:.3g}× C), a noise norm z·C·√d/n ≈ {noise['norm']:.3g}, "
            f"{noise['norm_over_clip']:.3g}× C, on a mean of clipped updates whose norm is at "
            "most C"
        )
        if noise["norm_over_clip"] >= 1:
            text += (
                "; more than the largest mean of clipped updates it protects: learning then rests "
                "on the noise averaging out over the rounds, and far past C the model learns "
                "nothing or diverges (non-finite losses; benchmarks/privacy measures both); the "
                f"noise's norm falls to C with about {math.ceil(noise['devices_for_clip']):,} "
                "devices a round, or with a larger ε or fewer rounds (docs/privacy.md)"
            )
        log.log(logging.WARNING if noise["norm_over_clip"] >= 1 else logging.INFO, "%s", text)
        return text

    def all_failed_hint(self, failed: Mapping[str, str]) -> str:
        """Why every device may have failed a round: under central DP, with the devices' losses or
        arrays non-finite, the noise the server added (empty otherwise)."""
        if self.settings.mode != "central" or not (
                self.nonfinite_round or any(_diverged(r) for r in failed.values())):
            return ""
        made = (f"; the global model was non-finite after the noise of round "
                f"{self.nonfinite_round}" if self.nonfinite_round else "")
        return f"likely cause: DP noise diverged the global model ({self.expected_noise}{made})"

    # downlink, expected_uplink, ctx, options, … are the method's
    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def select(self, round: int, device_ids: Sequence[str], rng: np.random.Generator) -> list[str]:
        parts = self.parts
        eligible = [d for d in device_ids if self.ledger.can_spend(d, parts)]
        if len(eligible) < len(device_ids):
            log.info("round %d: %d devices have spent their privacy budget", round,
                     len(device_ids) - len(eligible))
        if not eligible:
            return []
        selected = self.inner.select(round, eligible, rng)
        for d in selected:  # counted when asked: an upper bound on what the device spends
            self.ledger.spend(d, parts)
        return selected

    def aggregate(self, round: int, uplinks: Mapping[str, Payload]) -> dict[str, float]:
        if self.settings.mode != "central" or not uplinks:
            return self.inner.aggregate(round, uplinks)
        return self.central_aggregate(round, uplinks)

    def central_aggregate(self, round: int, uplinks: Mapping[str, Payload],
                          devices: int | None = None) -> dict[str, float]:
        """``devices``: how many devices the uplinks stand for (secure aggregation hands over one
        average of that many device-clipped updates); default one per uplink."""
        release = self.release
        reference = {k: v for k, v in self.inner.state_dict().items() if release.in_whole(k)}
        clipped, within = {}, 0
        for d, p in uplinks.items():
            missing = [k for k in whole_names(p.arrays, release) if k not in reference]
            if missing:
                raise ConfigError(
                    f"dp=central: the server holds no {missing[0]!r} to clip {d}'s update against")
            within += update_norm(p.arrays, release, reference) <= self.clip
            arrays = clip_whole(p.arrays, release, reference, self.clip)
            arrays = {
                k: np.asarray(v).astype(np.asarray(p.arrays[k]).dtype) for k, v in arrays.items()
            }
            # equal weights: sensitivity C
            clipped[d] = Payload(arrays, {**p.meta, "num_samples": 1})
        metrics = dict(self.inner.aggregate(round, clipped))
        n = devices or len(uplinks)
        rng = self.inner.ctx.rng(round, stream=NOISE_STREAM) if self.repeatable else noise_rng(None)
        state = dict(self.inner.state_dict())
        std = self.update_noise * self.clip / n  # N(0, (z_Δ·C)²) on the sum, divided by n
        for k in whole_names(state, release):
            with np.errstate(over="ignore"):  # past the dtype's range: non-finite, checked below
                state[k] = (
                    np.asarray(state[k], np.float64) + rng.normal(0.0, std, np.shape(state[k]))
                ).astype(np.asarray(state[k]).dtype)
        if not all(np.isfinite(state[k]).all() for k in whole_names(state, release)):
            # the devices fail on it next round, and the run's ending message names the noise
            self.nonfinite_round = round + 1
            log.error("round %d: the global model is non-finite after central DP's noise; likely "
                      "cause: DP noise (%s)", round + 1, self.expected_noise)
        self.inner.load_state_dict(state)
        metrics["dp_clip"] = self.clip
        if self.settings.adaptive_quantile:
            share = (within + rng.normal(0.0, self.count_std)) / n
            self.clip *= math.exp(-CLIP_LR * (share - self.settings.adaptive_quantile))
            metrics["dp_unclipped_share"] = float(share)
        return metrics

    def round_report(self) -> dict[str, Any]:
        s = self.settings
        ids = sorted(self.inner.ctx.fleet)
        report = {
            "mode": s.mode,
            "target_epsilon": s.target_epsilon,
            "delta": s.delta,
            "noise_multiplier": self.noise_multiplier,
            "clip": self.clip,
            "epsilon": {d: self.ledger.epsilon(d) for d in ids},
            "budget_spent": [d for d in ids if not self.ledger.can_spend(d, self.parts)],
        }
        if s.trains_privately:  # per device: its sample rate sets its noise (edgefl.privacy.dpsgd)
            report.update(self.ledger.report(ids))
        return {"privacy": report}

    def state_dict(self) -> dict[str, np.ndarray]:
        out = dict(self.inner.state_dict())
        out.update(
            {f"dp/count/{d}": np.asarray(c, np.int64) for d, c in self.ledger.counts.items()})
        out["dp/clip"] = np.asarray(self.clip, np.float64)
        return out

    def load_state_dict(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.ledger.counts = {
            k.removeprefix("dp/count/"): int(v)
            for k, v in arrays.items()
            if k.startswith("dp/count/")
        }
        if "dp/clip" in arrays:
            self.clip = float(arrays["dp/clip"])
        self.inner.load_state_dict({k: v for k, v in arrays.items() if not k.startswith("dp/")})
