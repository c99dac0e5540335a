"""FedDW (dual-weight regularisation) against FedAvg and FedProx on real Fashion-MNIST, under the
benchmark protocol (issue 16). Run it with ``python -m benchmarks.feddw`` (``--quick`` for the
few-minute profile).
"""

from __future__ import annotations

import statistics

from benchmarks.common import benchmark_profile, fleet_text
from benchmarks.runner import Benchmark, Cell, Claim, Sweep, paired_difference

SEEDS = {"practical": (0, 1, 2), "pathological": (0, 1, 2, 3, 4)}  # ≥ 5 where the split swings
SETTINGS = {
    "practical": {"partition": "dirichlet", "alpha": 0.5, "fraction": 1.0},
    "pathological": {"partition": "shards", "classes_per_client": 2, "fraction": 0.5,
                     "rounds": 160, "lr_decay_rounds": (64, 112)},
}
#: The pathological split's per-round accuracy swings by ±10 points with half the 2-class devices
#: per round. With one ÷10 at round 60 the last quarter (rounds 60–80) held the jump the decay
#: itself makes (slopes 2–14), not convergence; there the schedule is the Felo/Velo code's
#: MultiStepLR: ÷10 at 40 % and 70 % of the rounds, so the last quarter is after both. At 80 rounds
#: (÷10 at 32 and 56) one seed in five dropped 12 points between rounds 52 and 56 and was still
#: climbing back at round 80 (slopes 2.3–4.6 for every method on that seed); the split runs 160
#: rounds (÷10 at 64 and 112), with the last quarter's 11 evaluations instead of 6.
#: method → (algorithm, options, head). Every method runs the paper's network (fc 256 → fc 128 →
#: classifier); the baselines' classifier keeps its bias, only the dual-weight methods drop it.
#: fedavg-linear: FedAvg with one Linear classifier on the features (the toolkit's default head; the
#: first run's baseline), to show how much of the gap is the head's capacity.
METHODS = {
    "fedavg": ("fedavg", {}, "mlp"),
    "fedprox": ("fedprox", {"mu": "0.01"}, "mlp"),
    "fedavg-linear": ("fedavg", {}, "linear"),
    "feddw": ("feddw", {}, "feddw"),
    "feddw-no-r": ("feddw", {"lam": "0"}, "feddw"),  # λ = 0: the same head and S, no regulariser
    "fedprox-dw": ("fedprox-dw", {"mu": "0.01"}, "feddw"),
}
#: Methods declared but not run by the profile declared for issue 37's one-hour rule (cost): the
#: head-capacity diagnostic, no claim of the paper and no control (its rows were "implied" only).
NOT_RUN = ("fedavg-linear",)
LAMBDAS = (0.1, 1.0, 10.0, 100.0)
GAIN = "gain:feddw-fedavg"
#: the server's per-round measure of FedDW's mechanism (classifier class relations against S)
RELATION = ("cr_diag_mean", "sl_diag_mean", "cr_sl_diag_gap", "cr_sl_distance")


def diagnostics(results: dict) -> str:
    """How close the global classifier's class relations (CR = rowsoftmax(W·Wᵀ)) come to the soft
    labels S, with the regulariser (feddw, fedprox-dw) and without it (feddw-no-r: λ = 0, same
    head and S): each metric's value after the last round, mean ± sd over seeds."""
    runs = results["runs"]
    lines = [
        "## The mechanism: CR against S",
        "",
        "FedDW pulls the classifier's class relations CR = rowsoftmax(W·Wᵀ) towards the "
        "soft-label matrix S "
        "the devices report. After the last round, mean ± sd over seeds: `diag CR` and `diag S` "
        "(their "
        "diagonal means), `|diag CR − diag S|` (mean absolute gap of the diagonals) and `R` = "
        "(1/C²)·‖S − CR‖²_F. "
        "**feddw-no-r** is FedDW with λ = 0: the same bias-free head and the same S, no "
        "regulariser.",
        "",
        "| setting | method | diag CR | diag S | abs(diag CR − diag S) | R |",
        "|---|---|---|---|---|---|",
    ]

    def cell(values: list[float]) -> str:
        if not values:
            return "—"
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        return f"{statistics.fmean(values):.4f} ± {sd:.4f}"

    for key in dict.fromkeys((r["setting"], r["method"]) for r in runs if r["role"] == "grid"):
        last = [next((p["server"] for p in reversed(r["per_round"]) if "server" in p), {})
                for r in runs if (r["setting"], r["method"]) == key and r["role"] == "grid"]
        if not any(last):
            continue
        lines.append(
            f"| {key[0]} | {key[1]} | "
            + " | ".join(cell([x[m] for x in last if m in x]) for m in RELATION)
            + " |"
        )
    return "\n".join(lines)


def profile(quick: bool) -> dict:
    """CNN tier 2 at width 0.25 with the FedDW head's fc 256 → fc 128 (bias-free classifier for the
    dual-weight methods), ten devices of about 600 images, one local epoch of Adam 1e-3 at batch 64
    per round, 80 rounds with the learning rate ÷10 from round 60 for every method (at 40 rounds
    without decay every claim was 'not converged': the baselines still rose 0.4–0.9 points per 10 %
    of rounds at Dir(0.5), and the pathological split's half participation swung them by 2–9)."""
    return benchmark_profile(quick, {
        "model": "cnn",
        "tiers": ("2",),
        "width": 0.25,
        "clients": 10,
        "rounds": 80,
        "lr_decay_rounds": (60,),
        "lr_gamma": 0.1,
        "optimizer": "adam",
        "lr": 1e-3,
        "batch_size": 64,
        "eval_every": 4,
    }, {"lr_decay_rounds": (3,)})


def make(quick: bool = False) -> Benchmark:
    base = profile(quick)
    settings = {"practical": SETTINGS["practical"]} if quick else SETTINGS
    seeds = {s: (0, 1, 2) if quick else SEEDS[s] for s in settings}

    def cell(method, setting, seed, role="grid", options=None, extra=None, name=None):
        algorithm, opts, head = METHODS.get(method, (method, {}, "linear"))
        config = {
            **base,
            **SETTINGS[setting],
            "algorithm": algorithm,
            "options": {**opts, **(options or {})},
            "head": head,
            **(extra or {}),
        }
        return Cell(method, name or setting, seed, config, role)

    run = [m for m in METHODS if m not in NOT_RUN]
    cells = [cell(m, s, seed) for s in settings for seed in seeds[s] for m in run]
    centralized = [cell("local", "practical", 0, role="bound", name="centralized",
                        extra={"clients": 1, "partition": "iid", "fraction": 1.0})]
    local_iid = [
        cell("local", "practical", seed, role="bound", name="local-iid", extra={"partition": "iid"})
        for seed in (0, 1, 2)
    ]
    sweep_grid = LAMBDAS[:2] if quick else LAMBDAS
    sweep_seeds = (0,) if quick else (0, 1)
    validation = {"validation_samples": 200 if quick else 1000}
    # the λ sweep ran (and stays cached) at the earlier profile: 40 rounds, no lr decay
    if not quick:
        validation.update(rounds=40, lr_decay_rounds=())
    sweeps = [
        Sweep(
            parameter="feddw.lam (no decay)",
            grid=sweep_grid,
            cells={
                lam: [
                    cell(
                        "feddw",
                        s,
                        seed,
                        role="sweep",
                        options={"lam": str(lam), "lam_decay_rounds": ""},
                        extra=validation,
                        name=f"sweep-{s}",
                    )
                    for s in settings
                    for seed in sweep_seeds
                ]
                for lam in sweep_grid
            },
            note="mean over the settings and seeds; validation split carved from the training "
            "data. "
            "0.1 is the earlier default (with its ÷10 decay it made FedDW train as FedAvg).",
        )
    ]
    # the paper's numbers: MNIST and CIFAR-10 (practical | pathological), FedDW − FedAvg
    paper = {"practical": "+0.21 MNIST (99.52 vs 99.31), +2.80 CIFAR-10 (66.24 vs 63.44)",
             "pathological": "+1.61 MNIST (96.66 vs 95.05), +9.37 CIFAR-10 (57.73 vs 48.36)"}
    claims = [Claim(f"feddw-gt-fedavg-{s}", "feddw > fedavg", s, paper=paper[s]) for s in settings]
    claims += [
        Claim(
            f"fedprox-dw-gt-fedprox-{s}",
            "fedprox-dw > fedprox",
            s,
            paper="FedProx+DW 48.39 (CIFAR-100 pathological; FedProx itself not reported, FedAvg "
            "43.47)",
        )
        for s in settings
    ]
    claims += [
        Claim(f"fedprox-dw-ge-fedprox-{s}", "fedprox-dw ≥ fedprox", s, kind="not worse")
        for s in settings
    ]
    # every method against FedAvg (the paper's reference); no Local runs in this grid
    claims += [Claim(f"{m}-gt-fedavg-{s}", f"{m} > fedavg", s, kind="implied")
               for s in settings for m in ("fedprox", "fedprox-dw", "feddw-no-r") if m in run]
    if len(settings) == 2:
        claims.append(
            Claim(
                "gain-larger-pathological",
                "pathological > practical",
                GAIN,
                note="FedDW − FedAvg under the pathological split against under Dir(0.5), paired "
                "by seed",
                paper="+1.40 MNIST (1.61 vs 0.21), +6.57 CIFAR-10 (9.37 vs 2.80)",
            )
        )

    def derived(runs: list[dict]) -> list[dict]:
        return [
            d
            for s in SETTINGS
            for d in paired_difference(runs, "feddw", "fedavg", s, method=s, as_setting=GAIN)
        ]

    fleet = fleet_text(base, quick, quick_note=", Dir(0.5) only", note=" under Dir(0.5), 160 under "
                       "the pathological split (the λ sweep: 40)")
    return Benchmark(
        name="feddw",
        title="FedDW vs FedAvg / FedProx on Fashion-MNIST",
        description=f"""
Model: CNN tier 2 at **width 0.25** with the paper's head (fc 256 → fc 128 → classifier) for every
method: bias-free classifier for FedDW and FedProx+DW, classifier with bias for FedAvg and FedProx;
**fedavg-linear** (FedAvg with a single Linear classifier on the CNN's features, no fc layers) is
declared but not run by this profile (cost: a diagnostic of the head's capacity, no claim);
{fleet}; one local epoch of Adam 1e-3 (re-created each round; for every method ÷10 from round 60
under Dir(0.5), ÷10 at rounds 64 and 112 under the pathological split — the Felo/Velo code's
MultiStepLR at 40 %/70 %, so that the last quarter comes after both: at 40 rounds without decay no
claim could be read, a single decay at round 60 put its own jump into the pathological split's
last quarter, and at 80 rounds one seed in five was still climbing back from a 12-point drop) at
batch 64 per round; FedProx μ =
0.01. Settings: **practical** = Dir(0.5), every device every round; **pathological** = 2 classes per
device (shards), half the devices per round. Seeds: 3 for practical, 5 for pathological. Accuracy:
the mean over devices of the final model on {base["test_samples"]:,} test images. FedDW's λ is the \
method's default,
chosen by the λ sweep below (no decay); **feddw-no-r** is FedDW with λ = 0 (same head and soft
labels, no regulariser), the reference for the mechanism's diagnostic below.

FedProx's μ = 0.01 and FedDW's λ = 100 (the edge of the λ grid) were checked on the λ sweep's
own runs by [`baselines.md`](baselines.md) (its rule, paired by setting and seed, fixed before its
cells ran): FedProx had the same sweep budget (μ 0.001–1) and λ = 1,000 ran beside 100. Both
grid values stay. λ = 1,000 equals 100 (+0.00 ± 0.64 points), so λ's curve is flat past the
edge. μ = 1 is the best mean (+3.00 ± 6.39 points over 0.01), within the noise, and its gain
depends on the split: +11.6 and +4.0 points on the pathological split's two runs, −1.0 and −2.6
on the practical one's. Two seeds per setting cannot settle a μ per setting.
""",
        cells=cells,
        claims=claims,
        sweeps=sweeps,
        bounds={"centralized": centralized, "local_iid": local_iid},
        derived=derived,
        keep_server_metrics=RELATION,
        diagnostics=diagnostics,
        command="python -m benchmarks.feddw" + (" --quick" if quick else ""),
        paper="FedDW (Liu et al., Distilling Weights through Consistency Optimization)",
    )
