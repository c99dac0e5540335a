"""Server optimizers (Reddi et al., "Adaptive Federated Optimization", ICLR 2021) on FedAvg: the
server lr η of FedAvgM, FedAdagrad, FedYogi and FedAdam swept on a validation split over the
paper's half-decade grid, and each optimizer at its default η against plain averaging on the test
set (issue 39). Run it with ``python -m benchmarks.server_opt --workers 2`` (``--quick`` for the
few-minute profile).
"""

from __future__ import annotations

from benchmarks.common import benchmark_profile, fleet_text
from benchmarks.runner import Benchmark, Cell, Claim, Sweep

SEEDS = (0, 1, 2)
#: the devices' recipe: the CNN family's default (SGD lr 0.01, momentum 0.9; chosen for stability
#: on a validation split by benchmarks/foundation/recipes.py) with the lr ×0.1 once at 70 % of the
#: rounds, so the last quarter, where convergence is read, comes after the step: chosen on this
#: profile's validation split before this declaration (benchmarks/foundation/converge.md). The
#: profile ran SGD lr 0.05 before: its centralized bound peaked at 82.8 % (round 6) and ended at
#: 76.7 %, and one Local-IID device ended at chance (9.9 %), Local-IID 72.9 %: the gates failed.
RECIPE = {"optimizer": "sgd", "lr": 0.01, "momentum": 0.9}
STEP = 0.7
#: η per optimizer: the paper's grid 10^{-3, -2.5, …, 1} (half decades, written to 3 digits) cut to
#: the decades where its best η lie for each optimizer (its appendix: FedAvgM near 10^0 at momentum
#: 0.9, FedAdagrad 10^{-1.5}–10^{-0.5}, FedAdam and FedYogi 10^{-2.5}–10^{-1}), to fit the budget.
GRIDS = {
    "fedavgm": (0.316, 1.0),
    "fedadagrad": (0.01, 0.0316, 0.1, 0.316),
    "fedyogi": (0.00316, 0.01, 0.0316, 0.1),
    "fedadam": (0.00316, 0.01, 0.0316, 0.1),
}
OPTIMIZERS = tuple(GRIDS)


def profile(quick: bool) -> dict:
    """CNN tier 2 at width 0.25, ten devices of Dir(0.5) shards of 4,500 training images (about 360
    each once the validation share is carved out), one local epoch of :data:`RECIPE` (batch 32) per
    round, the lr ×0.1 at 70 % of the rounds, 30 rounds, every device every round."""
    base = benchmark_profile(quick, {
        "algorithm": "fedavg",
        "model": "cnn",
        "tiers": ("2",),
        "width": 0.25,
        "clients": 10,
        "partition": "dirichlet",
        "alpha": 0.5,
        "fraction": 1.0,
        "rounds": 30,
        **RECIPE,
        "batch_size": 32,
        "train_samples": 4500,
        "eval_every": 3,
    })
    return {**base, "lr_decay_rounds": (round(STEP * base["rounds"]),)}


def label(opt: str, lr: float | None = None) -> str:
    return opt if lr is None else f"{opt} η={lr:g}"


def make(quick: bool = False) -> Benchmark:
    from edgefl.algorithms.server_opt import DEFAULT_LR

    base = profile(quick)
    seeds = (0,) if quick else SEEDS
    grids = {o: g[:2] for o, g in GRIDS.items()} if quick else GRIDS
    validation = {"validation_samples": 300 if quick else 900}

    def cell(method, seed, setting, role="grid", extra=None):
        return Cell(method, setting, seed, {**base, **(extra or {})}, role)

    def opt(name, lr=None):
        return {"server_opt": name, **({"server_opt_lr": lr} if lr is not None else {})}

    # the test split: plain averaging and each optimizer at its default η (what --server-opt X
    # gives), written into the cell so that a new default is a new cell, never a reused one
    cells = [cell("fedavg", s, "dir0.5") for s in seeds]
    cells += [cell(o, s, "dir0.5", extra=opt(o, DEFAULT_LR[o])) for o in OPTIMIZERS for s in seeds]
    # the validation split: every grid value as a run too (the sweep's cells: the same runs), and
    # FedAvg beside them
    cells += [cell("fedavg", s, "validation", extra=validation) for s in seeds]
    cells += [
        cell(label(o, lr), s, "validation", extra={**validation, **opt(o, lr)})
        for o in OPTIMIZERS
        for lr in grids[o]
        for s in seeds
    ]
    sweeps = [
        Sweep(
            parameter=f"server_opt_lr ({o})",
            grid=grids[o],
            cells={
                lr: [
                    cell(
                        label(o, lr),
                        s,
                        "validation",
                        role="sweep",
                        extra={**validation, **opt(o, lr)},
                    )
                    for s in seeds
                ]
                for lr in grids[o]
            },
            default=DEFAULT_LR[o] if DEFAULT_LR[o] in grids[o] else None,
            note="β1 = 0.9, β2 = 0.99, τ = 1e-3 (the paper's); "
            f"{'momentum β1' if o == 'fedavgm' else 'no bias correction, v₀ = τ²'}.",
        )
        for o in OPTIMIZERS
    ]
    bounds = {
        # three seeds: the gate's noise is the bound's sd too (one run has none)
        "centralized": [
            cell(
                "local",
                s,
                "centralized",
                role="bound",
                extra={"algorithm": "local", "clients": 1, "partition": "iid"},
            )
            for s in seeds
        ],
        "local_iid": [
            cell(
                "local",
                s,
                "local-iid",
                role="bound",
                extra={"algorithm": "local", "partition": "iid"},
            )
            for s in seeds
        ],
    }
    # not the paper's numbers (its tasks differ): whether each optimizer at its default η beats or
    # matches plain averaging here, evaluated as claims are, shown apart and left out of the count
    claims = [Claim(f"{o}-vs-fedavg", f"{o} ≥ fedavg", "dir0.5", diagnostic=True,
                    note="non-inferiority at the optimizer's default η") for o in OPTIMIZERS]
    fleet = fleet_text(base, quick, images="900 of them the validation split in the sweeps",
                       quick_note=", one seed", note=", seeds 0–2")
    return Benchmark(
        name="server_opt",
        title="Server optimizers (FedAvgM, FedAdagrad, FedYogi, FedAdam) on FedAvg, Fashion-MNIST "
        "Dir(0.5)",
        description=f"""
FedAvg's devices (CNN tier 2 at **width 0.25**, one local epoch of SGD lr {base["lr"]:g} \
with momentum {base["momentum"]:g} at batch 32, the lr ×0.1 at round \
{base["lr_decay_rounds"][0]}, every device every round) under Dir(0.5); {fleet}. The devices'
recipe is the CNN family's default, chosen for stability on a validation split
([`../foundation/recipes.md`](../foundation/recipes.md)), with one ×0.1 step at 70 % of the
rounds, chosen on this profile's validation split before its declaration
([`../foundation/converge.md`](../foundation/converge.md)); the profile ran SGD lr 0.05 before,
and its sanity gates failed (the centralized bound peaked at 82.8 % in round 6 and ended at
76.7 %; one Local-IID device ended at chance, 9.9 %, and Local-IID averaged 72.9 %). The server
turns the round's average into the new model with `--server-opt`
(`edgefl/algorithms/server_opt.py`: Reddi et al.'s Algorithm 2 with β1 = 0.9, β2 = 0.99,
τ = 1e-3, v₀ = τ², no bias correction; FedAvgM: momentum 0.9).

**dir0.5**: the test set ({base["test_samples"]:,} images), plain averaging (`fedavg`) and each
optimizer at its default η (`edgefl simulate --server-opt X` with no `--server-opt-lr`).
**validation**: the sweeps — every η of the grid, and plain averaging beside them — evaluated on a
validation split carved from the training data; the test set is never read there. The defaults
(`DEFAULT_LR` in `server_opt.py`) are the sweeps' chosen values. On this profile the sweeps chose
η = 0.0316 for FedYogi and FedAdam, whose default was still 0.01 (the choice of the SGD 0.05
profile) when their test cells first ran at 0a9c335 (+2.20 ± 0.51 and +2.05 ± 0.33 points over
FedAvg there); the default then followed the sweep, as the rule says, and their test cells were
rerun at 0.0316 (each test cell now names its η, so a new default is a new cell, never a reused
one). The paper's half-decade grid is
cut to the decades of its own best values per optimizer to fit the hour the benchmark may take on
two cores. The centralized bound and Local-IID run three seeds each.
""",
        cells=cells,
        claims=claims,
        sweeps=sweeps,
        bounds=bounds,
        command="python -m benchmarks.server_opt --workers 2"
        + (" --quick" if quick else ""),
    )
