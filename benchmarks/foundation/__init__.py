"""Foundation: FedAvg against Local on real Fashion-MNIST, under the benchmark protocol.

The first thing a federated toolkit must show: on a non-IID split, devices that federate beat
devices that train alone. Run it with ``python -m benchmarks.foundation`` (``--quick`` for the
few-minute profile).
"""

from __future__ import annotations

from benchmarks.common import benchmark_profile, fleet_text
from benchmarks.runner import Benchmark, Cell, Claim

#: Dir(0.1) is a pathological split: five seeds (BENCHMARKS.md); IID and the bound three
SEEDS = {"dir0.1": (0, 1, 2, 3, 4), "iid": (0, 1, 2)}
BOUND_SEEDS = (0, 1, 2)
#: the CNN family's default recipe, chosen by the stability sweep of
#: :mod:`benchmarks.foundation.recipes` (recipes.md) and pinned here as the benchmark's declared
#: setting
RECIPE = {"optimizer": "sgd", "lr": 0.01, "momentum": 0.9}
#: the lr ×0.1 once at 70 % of the rounds (round 21 of 30), so the last quarter, where convergence
#: is read, comes after the step: chosen on this profile's validation split by the rule of
#: :mod:`benchmarks.foundation.converge` (converge.md) before this declaration
STEP = 0.7
SETTINGS = {
    "dir0.1": {"partition": "dirichlet", "alpha": 0.1},
    "iid": {"partition": "iid"},
}
METHODS = ("fedavg", "local")


def profile(quick: bool) -> dict:
    """The small CNN (tier 2) at width 0.5, ten devices of about 600 images, every device every
    round, one local epoch of :data:`RECIPE` at batch 32 per round, the lr ×0.1 at 70 % of the
    rounds (:data:`STEP`)."""
    base = benchmark_profile(quick, {
        "model": "cnn",
        "tiers": ("2",),
        "width": 0.5,
        "clients": 10,
        "fraction": 1.0,
        "rounds": 30,
        **RECIPE,
        "batch_size": 32,
        "eval_every": 3,
    })
    return {**base, "lr_decay_rounds": (round(STEP * base["rounds"]),)}


def make(quick: bool = False) -> Benchmark:
    base = profile(quick)

    def cell(method, setting, seed, role="grid", extra=None, name=None):
        config = {**base, **SETTINGS[setting], "algorithm": method, **(extra or {})}
        return Cell(method, name or setting, seed, config, role)

    seeds = {s: xs[:3] if quick else xs for s, xs in SEEDS.items()}
    cells = [cell(m, s, seed) for s in SETTINGS for seed in seeds[s] for m in METHODS]
    # the upper bound: one model on the union of the devices' data, the same sample visits
    centralized = [
        cell("local", "iid", seed, role="bound", extra={"clients": 1}, name="centralized")
        for seed in (BOUND_SEEDS[:1] if quick else BOUND_SEEDS)
    ]
    local_iid = [c for c in cells if c.method == "local" and c.setting == "iid"]
    fleet = fleet_text(base, quick)
    return Benchmark(
        name="foundation",
        title="Foundation: FedAvg vs Local on Fashion-MNIST",
        description=f"""
One model family for every device: the small CNN (tier 2) at **width 0.5**; {fleet}; every device
every round; one local epoch of SGD lr {base["lr"]:g} (momentum {base["momentum"]:g}) at batch 32 \
per round: the
CNN family's default recipe, chosen for stability on a validation split by
[`recipes.py`](recipes.py) ([recipes.md](recipes.md)). Accuracy: mean over devices of each device's
model on {base["test_samples"]:,} test images. Settings: Dir(0.1) (the claim) and IID (the \
reference; Local on
IID is the lower bound). Seeds {list(seeds["dir0.1"])} for Dir(0.1) (a pathological split),
{list(seeds["iid"])} for IID (a seed changes the partition, the initialisation and the sampling).
Centralized: one model on all the devices' training images for the same number of epochs (the
same sample visits), seeds {list(BOUND_SEEDS[:1] if quick else BOUND_SEEDS)}.

The lr is multiplied by 0.1 once, at round {base["lr_decay_rounds"][0]} (70 % of the rounds),
so the last quarter, where convergence is read, comes after the step: chosen on this profile's
validation split before this declaration ([converge.md](converge.md): FedAvg's last-quarter slope
0.35 at Dir(0.1) and −0.10 at IID, the centralized bound 87.20 % above FedAvg-IID's 84.70 %).
With a constant lr the earlier run's FedAvg-IID ended at slope 0.53 (≥ 0.5: its IID rows not
comparable; its page is [`previous/constant-lr-results.md`](previous/constant-lr-results.md)).
The centralized bound is below the issue's ≥ 90 % target because the devices hold 6,000 images,
not because it is undertrained: [ceiling.md](ceiling.md) measured it on the validation split
(seeds 10–12, its rule fixed before its cells ran). Twice the epochs on the same images moves it
−0.20 points (87.00 ± 0.75 % against 87.20 ± 1.15 %, every last-quarter slope 0.00): it is at its
ceiling for the devices' data. The same CNN and recipe on all 60,000 training images (10 epochs)
reach 92.00 ± 0.62 %. The bound stays one model on the devices' own 6,000 images, the union the
federated methods train on.
""",
        cells=cells,
        claims=[
            Claim(
                "fedavg-gt-local-dir0.1",
                "fedavg > local",
                "dir0.1",
                paper="the toolkit's own claim (federating beats training alone on a non-IID "
                "split); no paper number",
            ),
            Claim(
                "fedavg-gt-local-iid",
                "fedavg > local",
                "iid",
                kind="implied",
                note="on IID shards federation sees ten times the data",
            ),
            Claim(
                "fedavg-ge-local-iid",
                "fedavg ≥ local",
                "iid",
                kind="not worse",
                note="reference: federation must not hurt on IID",
            ),
        ],
        bounds={"centralized": centralized, "local_iid": local_iid},
        command="python -m benchmarks.foundation" + (" --quick" if quick else ""),
        paper="Foundation: FedAvg against Local (McMahan et al.; the toolkit's own check)",
    )
