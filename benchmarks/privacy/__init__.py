"""Accuracy against the privacy budget ε (issue 40): FedAvg with central DP (DP-FedAvg), and Felo,
FedProto and FedDW with local DP on their uplinks, ε ∈ {1, 4, 8, ∞} at δ = 1e-5, Fashion-MNIST
Dir(0.5), three seeds, with Local, Local-IID and the centralized bound beside them. Run it with
``nice -n 10 python -m benchmarks.privacy --workers 2`` (``--quick`` for the few-minute profile).
The clips come from ``python -m benchmarks.privacy.diagnose`` (validation split; diagnose.md).
"""

from __future__ import annotations

from benchmarks.privacy.page import diagnostics
from benchmarks.runner import Benchmark, Cell, Claim

SEEDS = (0, 1, 2)
EPSILONS = (1, 4, 8)  # and ∞: the method without DP
DELTA = "1e-5"
SETTING = "dir0.5"
#: The clips, each the median of the measured norms on the validation split (diagnose.md):
#: Felo's per-sample [logits, features] vector, FedProto's per-sample feature, and the round-0
#: weight update of a FedAvg device (FedAvg and FedDW: CNN tier 2 at width 0.25).
CLIPS = {"felo": "9", "fedproto": "7", "fedavg": "1.5", "feddw": "0.77"}
MODES = {"felo": "local", "fedproto": "local", "feddw": "local", "fedavg": "central"}


#: DP-FedAvg (central) and FedDW (local DP on its weights) diverge under the noise (devices'
#: training losses past 1e12 or non-finite, refused), and a run where every device fails a round
#: is ended by the loop. Such a run is a cell like any other (benchmarks/cells.py): it keeps its
#: last evaluated accuracy and its rounds, with ``stopped_at_round`` and ``stop_reason``, and the
#: gates count it as collapsed. (Their first cells killed the runner, which then stopped at any
#: cell that raised, and a separate script measured them outside it.)


def profile(quick: bool) -> dict:
    """Ten devices of Dir(0.5) shards of 3,000 Fashion-MNIST training images (about 300 each),
    one local epoch per round, every device every round, 16 rounds with the learning rate ÷10
    from round 11 (so the last quarter, rounds 12–16, reads the flattened curve)."""
    base = {
        "dataset": "fashion-mnist",
        "clients": 10,
        "partition": "dirichlet",
        "alpha": 0.5,
        "fraction": 1.0,
        "rounds": 16,
        "lr_decay_rounds": (10,),
        "lr_gamma": 0.1,
        "epochs": 1,
        "train_samples": 3000,
        "test_samples": 2000,
        "eval_samples": 500,
        "eval_every": 1,
    }
    if quick:
        base.update(clients=5, rounds=3, lr_decay_rounds=(2,), train_samples=1000, test_samples=500,
                    eval_samples=300)
    return base


#: Felo and FedProto on three CNN tiers at width 0.25 with a common 128-d feature, SGD 0.05 at
#: batch 32 (the same training for both); Felo knowledge only (average_weights off), so what
#: leaves a device is its per-class statistics, which local DP protects per sample.
HETERO = {"model": "cnn", "tiers": ("1", "2", "3"), "width": 0.25, "feature_dim": 128,
          "model_options": {}, "optimizer": "sgd", "lr": 0.05, "batch_size": 32}
FELO = {"algorithm": "felo", **HETERO}
FEDPROTO = {"algorithm": "fedproto", **HETERO}
#: FedAvg and FedDW: CNN tier 2 at width 0.25, each method's defaults otherwise (FedDW's head and
#: Adam; one local epoch as every method here).
#: (lr pinned at 0.05, the default these cells ran with: the CNN default became 0.01 after them)
FEDAVG = {"algorithm": "fedavg", "model": "cnn", "tiers": ("2",), "width": 0.25, "lr": 0.05}
FEDDW = {"algorithm": "feddw", "model": "cnn", "tiers": ("2",), "width": 0.25}
METHODS = {"fedavg": FEDAVG, "felo": FELO, "fedproto": FEDPROTO, "feddw": FEDDW}


def label(method: str, epsilon: float | None) -> str:
    return f"{method} ε={'∞' if epsilon is None else epsilon}"


def options(method: str, epsilon: float | None) -> dict:
    own = {"average_weights": "false"} if method == "felo" else {}
    if epsilon is None:
        return own
    return {**own, "dp": MODES[method], "dp_target_epsilon": str(epsilon), "dp_delta": DELTA,
            "dp_clip": CLIPS[method]}


def make(quick: bool = False) -> Benchmark:
    base = profile(quick)
    seeds = (0,) if quick else SEEDS
    cells = []
    for epsilon in (None, 8, 1, 4):  # the order the cells run in
        for method, settings in METHODS.items():
            config = {**base, **settings, "options": options(method, epsilon)}
            cells += [Cell(label(method, epsilon), SETTING, s, config) for s in seeds]
    # Local on Felo's devices and models: what a device reaches without any uplink (ε = 0)
    cells += [
        Cell("local", SETTING, s, {**base, **FELO, "algorithm": "local", "options": {}})
        for s in seeds
    ]
    local_iid = [Cell("local", "local-iid", s, {**base, **FELO, "algorithm": "local", "options": {},
                                                "partition": "iid"}, role="bound") for s in seeds]
    # one model (CNN tier 2 at width 0.25) on the union of the devices' data: the same sample visits
    centralized = [
        Cell(
            "local",
            "centralized",
            s,
            {**base, **FEDAVG, "algorithm": "local", "clients": 1, "partition": "iid"},
            role="bound",
        )
        for s in seeds
    ]
    claims = []
    for m in METHODS:
        claims.append(
            Claim(
                f"{m}-eps8-gt-local",
                f"{label(m, 8)} > local",
                SETTING,
                paper="issue 40 (ours)",
                note=f"{m} under DP at ε = 8 still adds accuracy over no federation",
            )
        )
        claims.append(
            Claim(
                f"{m}-eps8-ge-nondp",
                f"{label(m, 8)} ≥ {label(m, None)}",
                SETTING,
                kind="not worse",
                note=f"{m} at ε = 8 not worse than without DP",
            )
        )
        claims.append(
            Claim(
                f"{m}-privacy-cost",
                f"{label(m, None)} > {label(m, 1)}",
                SETTING,
                kind="diagnostic",
                note="the noise costs accuracy at the tightest budget",
            )
        )
    fleet = (
        "5 devices, 1,000 training images, 3 rounds, one seed"
        if quick
        else "10 devices, 3,000 training images (about 300 a device), 16 rounds (lr ÷10 from round "
        "11), seeds 0–2"
    )
    return Benchmark(
        name="privacy",
        title="Accuracy against the privacy budget ε: FedAvg (central DP), Felo, FedProto and "
        "FedDW (local DP), "
        "Fashion-MNIST Dir(0.5)",
        description=f"""
{fleet}; one local epoch per round, every device every round; ε ∈ {{1, 4, 8, ∞}} at δ = {DELTA}
(ε = ∞: the method without DP), the noise multiplier the smallest that spends the budget over the
run's rounds (`--target-epsilon`; docs/privacy.md). No sampling amplification is claimed.

**Felo** and **FedProto** (`--dp local`): three CNN tiers at **width 0.25** with a common 128-d
feature, SGD 0.05 at batch 32; Felo knowledge only (`-o average_weights=false`). Each device clips
every sample's statistics vector (Felo: [logits, features]; FedProto: its feature) to C and noises
its per-class sums and counts before the uplink: ε per *sample* of a device.
**FedDW** (`--dp local`): CNN tier 2 at **width 0.25**, its head and Adam; its uplink is its
weights (clipped around the received model and noised on the device) and its per-class soft-label
sums: ε per *sample* for the sums, per *device dataset* for the weights.
**FedAvg** (`--dp central`): CNN tier 2 at **width 0.25**, its defaults otherwise; the server clips
each update to C, averages with equal weights and adds noise z·C/n per coordinate (n = 10).
**local**: Felo's devices and models without any uplink; **local-iid**: the same on IID shards;
**centralized**: CNN tier 2 at width 0.25 on the union of the training data, the same sample visits.

Clips (the median of the measured norms at round 0 on a validation split, rounded; the diagnostics
below): Felo {CLIPS["felo"]}, FedProto {CLIPS["fedproto"]}, FedAvg {CLIPS["fedavg"]}, FedDW \
{CLIPS["feddw"]}.
A run that stops before its last round is a cell with the round it stopped at and why: **every
device failed** a round (losses non-finite or past 1e12, refused; the loop ends the run) counts as
a **collapsed** run, and its accuracy is that of its last evaluated round; **every device's
privacy budget spent** is a legitimate end, its accuracy what the fleet has at that point (the
noise here is calibrated to spend the budget over all 16 rounds; "What holds" counts both kinds).
The DP-FedAvg and FedDW cells were added to the grid after the others had run (the runner then
died at a stopped run): `--missing-only` ran just them (18 cells at 850412e, 1,270 s on 2 workers
at a load of 14–22, 2026-11-26 18:55–19:17 UTC; the machine line below is the first run's).
A device's noisy per-class means (Felo, FedProto) are projected onto the C-ball before the uplink
(post-processing, ε unchanged; edgefl/privacy/mechanisms.py): on the validation fleet it cuts the
release's error 2–3× (below), and without it devices diverged (non-finite logits and prototypes).
""",
        cells=cells,
        claims=claims,
        bounds={"centralized": centralized, "local_iid": local_iid},
        diagnostics=diagnostics,
        command="nice -n 10 python -m benchmarks.privacy --workers 2"
        + (" --quick" if quick else ""),
    )
