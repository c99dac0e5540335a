"""Time to accuracy on a fleet as it is (issue 39): synchronous FedAvg, FedBuff (asynchronous,
buffered) and FedAdam on ten devices with churn (about 30 % offline at any time) and a 10× spread
of compute and link speed (``fleet.yaml``), measured on the simulated wall clock
(:mod:`edgefl.runtime.clock`): the simulated seconds until the per-round test accuracy first
reaches 80 %. Run it with ``python -m benchmarks.time_to_accuracy --workers 2`` (``--quick`` for
the few-minute profile).
"""

from __future__ import annotations

from pathlib import Path
from statistics import mean, stdev
from typing import Any

from benchmarks.runner import Benchmark, Cell, Claim

HERE = Path(__file__).parent
FLEET = "benchmarks/time_to_accuracy/fleet.yaml"  # relative to the repository (cells run there)
SEEDS = (0, 1, 2)
SETTING = "churn30-iid"
#: the CNN family's default recipe (benchmarks/foundation: chosen on a validation split)
RECIPE = {"optimizer": "sgd", "lr": 0.01, "momentum": 0.9}
BUFFER = 3  # FedBuff's K: updates per aggregation, of about 7 devices online at a time
ASYNC_PER_SYNC_ROUND = 3  # aggregations per synchronous round in the budget (3 × K = 9 updates)
THRESHOLDS = (0.7, 0.8)


def profile(quick: bool) -> dict[str, Any]:
    """CNN tier 2 at width 0.5, ten devices (the fleet file's) of IID shards of 600 training
    images, every online device every round, one local epoch of :data:`RECIPE` at batch 32."""
    base = {
        "dataset": "fashion-mnist",
        "model": "cnn",
        "tiers": ("2",),
        "width": 0.5,
        "clients": 10,
        "fleet_file": FLEET,
        "partition": "iid",
        "fraction": 1.0,
        "rounds": 30,
        "epochs": 1,
        **RECIPE,
        "batch_size": 32,
        "train_samples": 6000,
        "test_samples": 2000,
        "eval_samples": 1000,
        "eval_every": 1,
    }
    if quick:
        base.update(rounds=10, train_samples=2000, test_samples=500, eval_samples=300)
    return base


def make(quick: bool = False) -> Benchmark:
    base = profile(quick)
    seeds = (0,) if quick else SEEDS
    threshold = "70" if quick else "80"

    def cell(
        method: str,
        seed: int,
        extra: dict[str, Any] | None = None,
        setting: str = SETTING,
        role: str = "grid",
    ) -> Cell:
        return Cell(method, setting, seed, {**base, "algorithm": "fedavg", **(extra or {})}, role)

    fedbuff = {
        "aggregation": "async",
        "buffer": BUFFER,
        "rounds": base["rounds"] * ASYNC_PER_SYNC_ROUND,
    }
    cells = [cell("fedavg", s) for s in seeds]
    cells += [cell("fedbuff", s, fedbuff) for s in seeds]
    cells += [cell("fedadam", s, {"server_opt": "fedadam"}) for s in seeds]
    no_fleet = {"fleet_file": None, "eval_every": 3}
    bounds = {
        "centralized": [
            cell(
                "local", 0, {**no_fleet, "algorithm": "local", "clients": 1}, "centralized", "bound"
            )
        ],
        "local_iid": [
            cell("local", s, {**no_fleet, "algorithm": "local"}, "local-iid", "bound")
            for s in seeds
        ],
    }
    metric = f"time_to_{threshold}"
    claims = [
        Claim(
            "fedbuff-sooner",
            "fedbuff < fedavg",
            SETTING,
            metric=metric,
            paper="FedBuff reaches the target accuracy in less wall-clock time than synchronous "
            "FedAvg when devices differ in speed (Nguyen et al., AISTATS 2022, §6)",
            note=f"simulated seconds to {threshold} % test accuracy",
        ),
        Claim(
            "fedadam-sooner",
            "fedadam < fedavg",
            SETTING,
            metric=metric,
            kind="implied",
            paper="adaptive server optimizers converge in fewer rounds than FedAvg "
            "(Reddi et al., ICLR 2021); the same rounds take the same time here",
            note=f"simulated seconds to {threshold} % test accuracy, FedAdam at its default η",
        ),
        Claim(
            "fedbuff-updates",
            "fedbuff > fedavg",
            SETTING,
            metric=f"updates_to_{threshold}",
            kind="diagnostic",
            note="device updates aggregated before the threshold: "
            "the cost of asynchrony in work, not in time",
        ),
        Claim(
            "fedbuff-final",
            "fedbuff ≥ fedavg",
            SETTING,
            kind="diagnostic",
            note="final accuracy after each method's budget (non-inferiority)",
        ),
    ]
    fleet = (
        "one seed, 2,000 training images, 10 rounds (30 aggregations), threshold 70 %"
        if quick
        else "seeds 0–2, 6,000 training images (600 per device), 30 rounds (FedBuff: 90"
        " aggregations of 3 updates), threshold 80 %"
    )
    return Benchmark(
        name="time_to_accuracy",
        title="Time to accuracy on a fleet with churn and a 10× speed spread: "
        "FedAvg, FedBuff, FedAdam",
        description=f"""
Ten devices ([`fleet.yaml`](fleet.yaml)): Raspberry Pi 4 profiles at speed 1, 0.316 and 0.1 (3, 4
and 3 devices: a 10× spread of compute), links of 2 / 0.632 / 0.2 Mbit/s down and half that up
with 20 / 60 / 200 ms latency (a 10× spread of bandwidth), and churn: online spells of 700 s and
offline spells of 300 s on average (30 % offline at any time). The clock
([`edgefl/runtime/clock.py`](../../edgefl/runtime/clock.py)) charges each device its model's
download and upload on its link and its training cost (the samples it trains × the model's FLOPs
per sample ÷ its profile's train_gflops × speed), modelled, so the clock is the same under any
machine load; evaluation takes no simulated time.

Training: CNN tier 2 at **width 0.5**, IID shards of Fashion-MNIST, one local epoch of SGD lr 0.01
(momentum 0.9) at batch 32 (the CNN family's recipe, benchmarks/foundation); {fleet}.
**fedavg**: synchronous rounds of every device online at the round's start, ending at the slowest
(no deadline); a device that goes offline mid-round is dropped that round. **fedbuff**:
`--aggregation async --buffer {BUFFER}`, staleness-weighted 1/√(1+τ); devices offline when they
would pull the model pull it when they are back, updates of devices that go offline in flight are
lost. **fedadam**: synchronous FedAvg with `--server-opt fedadam` at its default η (chosen by
benchmarks/server_opt at width 0.25, Dir(0.5), SGD 0.05; not re-tuned for this recipe). Accuracy
per round on 1,000 test images (the last round: the final evaluation on 2,000); the time to a
threshold is the simulated clock at the end of the first round whose accuracy reaches it.
""",
        cells=cells,
        claims=claims,
        bounds=bounds,
        record_extras="benchmarks.time_to_accuracy.extras:extras",
        diagnostics=diagnostics,
        figures=figures,
        command="python -m benchmarks.time_to_accuracy --workers 2"
        + (" --quick" if quick else ""),
        paper="FedBuff (Nguyen et al., AISTATS 2022)",
    )


def _ms(xs: list[float]) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "—"
    return f"{mean(xs):.0f} ± {stdev(xs):.0f}" if len(xs) > 1 else f"{xs[0]:.0f}"


def diagnostics(results: dict) -> str:
    runs = [r for r in results["runs"] if r.get("role", "grid") == "grid"]
    methods = list(dict.fromkeys(r["method"] for r in runs))
    lines = [
        "## The fleet on the simulated clock",
        "",
        "| method | seeds | time to 70 % (s) | time to 80 % (s) | rounds to 80 % | updates to 80 % "
        "| simulated s in all | offline at selection | updates lost | final accuracy |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in methods:
        rs = [r for r in runs if r["method"] == m]
        off = [
            r.get("offline_at_selection") for r in rs if r.get("offline_at_selection") is not None
        ]
        reached = sum(r.get("time_to_80") is not None for r in rs)
        def col(key: str, rs: list[dict] = rs) -> str:
            return _ms([r.get(key) for r in rs])

        share = f"{100 * mean(off):.1f} %" if off else "—"
        lines.append(
            f"| {m} | {len(rs)} ({reached} reached 80 %) | {col('time_to_70')} "
            f"| {col('time_to_80')} | {col('rounds_to_80')} | {col('updates_to_80')} "
            f"| {col('simulated_seconds')} | {share} | {col('updates_lost')} "
            f"| {100 * mean(r['final_accuracy'] for r in rs):.2f} % |"
        )
    lines += [
        "",
        "Offline at selection: the share of the fleet offline when a synchronous round "
        "selected (the declared churn is 30 %). Updates lost: devices that went offline "
        "before their update arrived (synchronous: dropped that round).",
    ]
    return "\n".join(lines) + "\n"


def figures(results: dict, out: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in results["runs"] if r.get("role", "grid") == "grid" and r.get("clock")]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    colors = {}
    for r in runs:
        pts = [
            (r["clock"][p["round"] - 1], p["accuracy"])
            for p in r["per_round"]
            if p.get("accuracy") is not None and p["round"] <= len(r["clock"])
        ]
        color = colors.setdefault(r["method"], f"C{len(colors)}")
        label = (
            r["method"]
            if r["seed"] == min(x["seed"] for x in runs if x["method"] == r["method"])
            else None
        )
        ax.plot(
            [x for x, _ in pts],
            [100 * y for _, y in pts],
            color=color,
            alpha=0.8,
            lw=1,
            label=label,
        )
    ax.axhline(80, color="grey", ls="--", lw=0.8)
    ax.set_xlabel("simulated wall clock (s)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"{SETTING}: accuracy against the simulated clock (one line per seed)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "accuracy_clock.png", dpi=120)
    plt.close(fig)
    return "![accuracy against the simulated clock](accuracy_clock.png)\n"
