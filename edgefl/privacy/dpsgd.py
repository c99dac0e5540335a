"""DP-SGD on the device (``dp=sgd``; Abadi et al., 2016) with Opacus: sample-level differential
privacy for the weights a device trains, hence for every uplink computed from them.

Each step of local training draws a Poisson sample of the device's data (each sample in with
probability q, independently), computes each sample's gradient (Opacus's ``GradSampleModule``),
clips it to L2 norm C (``--clip``), sums, adds Gaussian noise of standard deviation z·C and
divides by the expected batch q·n (Opacus's ``DPOptimizer``); the method's optimizer then steps.
A round is ``steps`` such steps: ``epochs`` × ⌈n / batch⌉ with q = 1 / ⌈n / batch⌉ (Opacus's
own convention), or ``--steps``. The batches and the noise are drawn from the operating system's
entropy on the device, never from the run's seeds (which the server assigns): amplification by
subsampling needs a sample the adversary does not know, so a DP-SGD run does not repeat bit for
bit.

Accounting (:func:`sgd_epsilon`): a round is the ``steps``-fold composition of the
Poisson-subsampled Gaussian mechanism (q, z); a device's loss over its rounds is composed by
``dp-accounting``'s privacy-loss-distribution accountant (a pessimistic estimate: an upper
bound) for **replace-one** neighbouring datasets, the device's dataset size being public (it
registers it); Opacus's own accountants (RDP, PRV) are for add-or-remove-one and report less
(``tests/test_dpsgd.py`` checks both). z is calibrated per device (its n sets q) so that a
device taking part in every round spends at most ``--target-epsilon``.
"""

from __future__ import annotations

import functools
import math
import secrets
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dp_accounting  # the [privacy] install layer
import numpy as np
import torch
from dp_accounting import pld
from dp_accounting.privacy_accountant import NeighboringRelation

from edgefl.data import ArrayDataset
from edgefl.errors import ConfigError, EdgeflError
from edgefl.privacy.declare import PrivacyBudgetSpent, PrivacySettings, Release
from edgefl.privacy.trainer import PenalizedLoss, local_trainer
from edgefl.wire import Payload

#: Neighbouring datasets of the reported ε ("replace": one sample replaced; "add_remove": one
#: added or removed, Opacus's convention).
RELATIONS = {
    "replace": NeighboringRelation.REPLACE_ONE,
    "add_remove": NeighboringRelation.ADD_OR_REMOVE_ONE,
}
#: Discretisation of the privacy-loss distribution (pessimistic: ε is overestimated by < 0.3 %
#: against 1e-4 in the cases of tests/test_dpsgd.py, at a tenth of the time), and the coarser one
#: that brackets a calibration.
VALUE_INTERVAL = 1e-3
COARSE_INTERVAL = 1e-2


# --- the plan of a round and its accounting ------------------------------------------------------


@dataclass(frozen=True)
class SgdPlan:
    """One round of DP-SGD on ``num_samples`` samples: ``steps`` steps, each on a Poisson sample
    of rate ``sample_rate`` (expected batch ``sample_rate · num_samples``)."""

    num_samples: int
    sample_rate: float
    steps: int

    @property
    def expected_batch(self) -> float:
        return self.sample_rate * self.num_samples


def sgd_plan(num_samples: int, settings: Any) -> SgdPlan:
    """The plan of a round for a device of ``num_samples`` samples and these TrainSettings."""
    if num_samples < 1:
        raise ConfigError("dp=sgd: a device without training samples has nothing to train on")
    batches = math.ceil(num_samples / settings.batch_size)
    steps = settings.steps if settings.steps else settings.epochs * batches
    return SgdPlan(num_samples, 1.0 / batches, int(steps))


def _event(noise_multiplier: float, sample_rate: float, steps: int) -> dp_accounting.DpEvent:
    """One round as the library names it (what :func:`sgd_epsilon` composes)."""
    step = dp_accounting.PoissonSampledDpEvent(
        sample_rate, dp_accounting.GaussianDpEvent(noise_multiplier)
    )
    return dp_accounting.SelfComposedDpEvent(step, steps)


@functools.lru_cache(maxsize=256)
def _round_loss(
    noise_multiplier: float, sample_rate: float, steps: int, relation: str, interval: float
):
    """The privacy-loss distribution of one round (as the library's PLDAccountant builds it)."""
    step = pld.privacy_loss_distribution.from_gaussian_mechanism(
        noise_multiplier,
        value_discretization_interval=interval,
        sampling_prob=sample_rate,
        neighboring_relation=RELATIONS[relation],
    )
    return step.self_compose(steps)


@functools.lru_cache(maxsize=4096)
def sgd_epsilon(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    rounds: int = 1,
    relation: str = "replace",
    interval: float = VALUE_INTERVAL,
) -> float:
    """ε at ``delta`` of ``rounds`` rounds of ``steps`` Poisson-subsampled Gaussian steps (rate
    ``sample_rate``, noise multiplier ``noise_multiplier``), from privacy-loss distributions
    discretised at ``interval`` (pessimistic: an upper bound)."""
    if steps <= 0 or rounds <= 0:
        return 0.0
    loss = _round_loss(noise_multiplier, sample_rate, steps, relation, interval)
    return float((loss.self_compose(rounds) if rounds > 1 else loss).get_epsilon_for_delta(delta))


@functools.lru_cache(maxsize=1024)
def calibrate_sgd(
    target_epsilon: float, delta: float, sample_rate: float, steps: int, rounds: int
) -> float:
    """The smallest noise multiplier (to 0.2 %) whose ``rounds`` rounds of ``steps`` steps stay
    within ``target_epsilon``:
    a bisection on a coarse distribution (fast) brackets it, one on :func:`sgd_epsilon`'s finds it
    (a distribution of small z is slow to compute: the bracket keeps away from it)."""
    if steps <= 0 or rounds <= 0:
        raise ConfigError("nothing to calibrate: the run trains no step")
    if math.isinf(target_epsilon):
        raise ConfigError(
            "an infinite budget needs no noise; "
            "give a noise multiplier or a finite --target-epsilon"
        )

    def bisect(epsilon: Callable[[float], float], low: float, high: float, tol: float) -> float:
        while epsilon(low) <= target_epsilon:
            low /= 1.5
        while epsilon(high) > target_epsilon:
            high *= 1.5
        while high - low > tol * high:  # invariant: ε(low) > target ≥ ε(high)
            mid = (low + high) / 2
            low, high = (low, mid) if epsilon(mid) <= target_epsilon else (mid, high)
        return high

    rough = bisect(
        lambda z: sgd_epsilon(z, sample_rate, steps, delta, rounds, interval=COARSE_INTERVAL),
        0.5,
        2.0,
        0.02,
    )
    return bisect(
        lambda z: sgd_epsilon(z, sample_rate, steps, delta, rounds), rough * 0.9, rough * 1.02, 2e-3
    )


class SgdLedger:
    """Per device, the rounds of DP-SGD run so far against a budget. A device's plan (its q and
    steps) and noise multiplier come from ``plan_of(device_id)`` and ``noise_of(plan)``."""

    def __init__(
        self,
        settings: PrivacySettings,
        plan_of: Callable[[str], SgdPlan],
        noise_of: Callable[[SgdPlan], float],
    ):
        self.delta, self.target_epsilon = settings.delta, settings.target_epsilon
        self.plan_of, self.noise_of = plan_of, noise_of
        self.counts: dict[str, int] = {}

    def plan(self, device_id: str) -> tuple[SgdPlan, float]:
        plan = self.plan_of(device_id)
        return plan, self.noise_of(plan)

    def epsilon(self, device_id: str, extra: int = 0) -> float:
        """ε spent by ``device_id`` so far (after ``extra`` more rounds)."""
        plan, z = self.plan(device_id)
        return sgd_epsilon(
            z, plan.sample_rate, plan.steps, self.delta, self.counts.get(device_id, 0) + extra
        )

    def can_spend(self, device_id: str, count: int) -> bool:
        return self.epsilon(device_id, count) <= self.target_epsilon * (1 + 1e-9)

    def spend(self, device_id: str, count: int) -> float:
        self.counts[device_id] = self.counts.get(device_id, 0) + count
        return self.epsilon(device_id)

    def report(self, ids: list[str]) -> dict[str, Any]:
        """What a round record says of DP-SGD, per device: its noise multiplier, sample rate
        (Poisson sampling) and steps per round; the unit protected and the neighbouring relation."""
        plans = {d: self.plan(d) for d in ids}
        return {
            "unit": "sample",
            "sampling": "poisson",
            "neighbours": "replace-one",
            "noise_multiplier": {d: z for d, (_, z) in plans.items()},
            "sample_rate": {d: p.sample_rate for d, (p, _) in plans.items()},
            "steps_per_round": {d: p.steps for d, (p, _) in plans.items()},
        }


def sgd_ledger(settings: PrivacySettings, ctx: Any, rounds: int) -> SgdLedger:
    """The server's ledger: a device's plan from the size it registered (``ctx.fleet``) and the
    run's TrainSettings, as the device makes it from its data."""
    return SgdLedger(
        settings,
        lambda d: sgd_plan(max(ctx.fleet[d].num_samples, 1), ctx.settings),
        noise_for(settings, rounds),
    )


def noise_for(settings: PrivacySettings, rounds: int) -> Callable[[SgdPlan], float]:
    """The given noise multiplier, or the smallest that keeps a device taking part in all
    ``rounds`` rounds within the budget (per plan: a device's sample rate depends on its size)."""
    if settings.noise_multiplier is not None:
        return lambda plan: settings.noise_multiplier
    return lambda plan: calibrate_sgd(
        settings.target_epsilon, settings.delta, plan.sample_rate, plan.steps, max(rounds, 1)
    )


# --- the model and the training loop --------------------------------------------------------------


def check_trainable(model: torch.nn.Module, name: str) -> None:
    """Refuse a model DP-SGD cannot train: what Opacus's ModuleValidator finds (BatchNorm, …)
    and float buffers in the state (statistics of the private data that would travel un-noised)."""
    from opacus.validators import ModuleValidator  # the [dp-sgd] install layer

    errors = ModuleValidator.validate(model, strict=False)
    if errors:
        found = sorted({type(e).__name__ + ": " + str(e).split(".")[0] for e in errors})
        raise ConfigError(
            f"dp=sgd cannot train {name}: Opacus's ModuleValidator finds {'; '.join(found)} "
            "(a model with BatchNorm takes the model option norm=group)"
        )
    state = model.state_dict()
    params = {k for k, _ in model.named_parameters()}
    buffers = sorted(k for k, v in state.items() if k not in params and v.is_floating_point())
    if buffers:
        raise ConfigError(
            f"dp=sgd cannot train {name}: its float buffers {', '.join(buffers[:3])} would carry "
            "statistics of the private data outside DP-SGD"
        )


def dp_sgd(
    model: torch.nn.Module,
    data: ArrayDataset,
    plan: SgdPlan,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    clip: float,
    noise_multiplier: float,
) -> int:
    """One round of DP-SGD (the module doc) with ``optimizer``'s update rule; returns the steps
    taken. ``loss_fn`` is the mean of per-sample losses, or a PenalizedLoss."""
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    data_loss, penalty = (
        (loss_fn.data, loss_fn.penalty) if isinstance(loss_fn, PenalizedLoss) else (loss_fn, None)
    )
    params = [p for group in optimizer.param_groups for p in group["params"]]
    sampling = np.random.default_rng(secrets.randbits(128))  # the device's own entropy (module doc)
    # on the parameters' device: Opacus draws the noise there
    noise = torch.Generator(device=params[0].device).manual_seed(secrets.randbits(63))
    # in-place activations (ReLU(inplace=True)) modify what the per-sample hooks must see: off
    inplace = [m for m in model.modules() if getattr(m, "inplace", None) is True]
    for m in inplace:
        m.inplace = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus's notes on full backward hooks over image inputs
        gsm = GradSampleModule(model, batch_first=True, loss_reduction="mean", strict=True)
    dp = DPOptimizer(
        optimizer,
        noise_multiplier=noise_multiplier,
        max_grad_norm=clip,
        expected_batch_size=plan.expected_batch,
        generator=noise,
    )
    model.train()
    taken = 0
    try:
        for _ in range(plan.steps):
            gsm.zero_grad(set_to_none=True)
            dp.zero_grad(set_to_none=True)
            rows = np.flatnonzero(sampling.random(plan.num_samples) < plan.sample_rate)
            if len(rows):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    data_loss(data.images(rows), data.labels(rows)).backward()
            else:  # an empty sample: the step is noise alone
                for p in params:
                    p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device)
            if not dp.pre_step():
                raise EdgeflError("DP-SGD skipped a step it accounted for")
            if penalty is not None:  # of the weights alone: added after the noise (post-processing)
                grads = torch.autograd.grad(penalty(), params, allow_unused=True)
                for p, g in zip(params, grads, strict=True):
                    if g is not None:
                        p.grad.add_(g)
            dp.original_optimizer.step()
            taken += 1
    finally:
        dp.zero_grad(set_to_none=True)
        gsm._close()  # hooks and per-sample gradients off: the plain model again
        for m in inplace:
            m.inplace = True
    return taken


# --- the device half ------------------------------------------------------------------------------


class SgdDevice:
    """A device half whose local training is DP-SGD (``dp=sgd``): the method's code does not
    change; its one call of train_local per round runs :func:`dp_sgd` instead of the plain loop."""

    #: the final model is DP-SGD's output too: it may leave the device
    sends_final_model = True

    def __init__(self, inner: Any, settings: PrivacySettings, release: Release, rounds: int):
        self.inner, self.settings, self.release = inner, settings, release
        ctx = inner.ctx
        check_trainable(inner.model, ctx.spec.name)
        self.plan = sgd_plan(len(ctx.train_data), ctx.settings)
        self.noise_multiplier = noise_for(settings, rounds)(self.plan)
        self.ledger = SgdLedger(settings, lambda _: self.plan, lambda _: self.noise_multiplier)
        self.trained = 0

    def __getattr__(self, name: str) -> Any:  # model, ctx, expected_downlink, … are the method's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def receive(self, round: int, payload: Payload) -> None:
        self.inner.receive(round, payload)

    def finish(self, round: int, payload: Payload) -> None:
        self.inner.finish(round, payload)

    def train(self, model, data, settings, round, loss_fn, optimizer) -> dict[str, float]:
        """train_local's work within :meth:`fit` (edgefl.privacy.trainer)."""
        if model is not self.inner.model or data is not self.inner.ctx.train_data or self.trained:
            raise EdgeflError(
                "dp=sgd accounts for one round of training of the device's model on its own data "
                "per fit; this method trains otherwise"
            )
        self.trained += 1
        steps = dp_sgd(
            model, data, self.plan, loss_fn, optimizer, self.settings.clip, self.noise_multiplier
        )
        return {"dp_steps": float(steps)}

    def fit(self, round: int) -> Payload:
        me = self.inner.ctx.device_id
        if not self.ledger.can_spend(me, 1):
            raise PrivacyBudgetSpent(
                f"privacy budget spent: ε = {self.ledger.epsilon(me):.3f} "
                f"of {self.settings.target_epsilon:g} "
                f"(one more round would make it {self.ledger.epsilon(me, 1):.3f})"
            )
        self.trained = 0
        with local_trainer(self.train):
            up = self.inner.fit(round)
        if not self.trained:
            raise EdgeflError("dp=sgd: the method's round trained nothing through train_local")
        loose = sorted(k for k in up.arrays if not self.release.covers(k))
        if loose:
            raise EdgeflError(
                f"uplink arrays {', '.join(loose)} are not covered by the method's "
                "privacy declaration"
            )
        epsilon = self.ledger.spend(me, 1)
        # what the device computed on its data besides the weights (training loss …) stays here
        return Payload(
            dict(up.arrays), {"num_samples": up.meta["num_samples"], "dp_epsilon": epsilon}
        )
