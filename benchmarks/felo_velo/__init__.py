"""Felo / Velo (Chan & Ngai) on real Fashion-MNIST, under the benchmark protocol.

The declaration of :mod:`benchmarks.runner`: grid, bounds, sweep and claims. Run it with
``python -m benchmarks.felo_velo`` (``--quick`` for the few-minute profile).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks import pages
from benchmarks.common import benchmark_profile, decay_rounds, device_class_counts, fleet_text
from benchmarks.runner import Benchmark, Cell, Claim, mean_sd

DEPTHS = ("10", "14", "18", "22", "26")
SEEDS = (0, 1, 2)
#: The grid's seeds (issue 37): five, as the protocol reads where a method's seeds spread over more
#: than 5 points; over seeds 0-2 eight of the nine methods and settings did (5.1-6.1 points: FedHe,
#: Felo, Velo, Felo-KO, Velo-KO and Local at Dir(0.5), Felo and Velo at homo-Dir(0.5)). The quick
#: profile keeps three; the bounds keep three (Local-IID's seeds spread over 2.2 points).
SEEDS5 = (0, 1, 2, 3, 4)
FIVE = ("; five, since over seeds 0–2 eight of the nine methods' seeds spread over more than 5 "
        "points, where the protocol reads five")
#: the main heterogeneous setting (declared.json; with homo-dir0.5): the paper's non-IID split
SETTINGS = {"dir0.5": {"partition": "dirichlet", "alpha": 0.5}}
#: declared as alternatives and left out of the regenerated grid (issue 37: a benchmark
#: regenerates in an hour on 2 cores): the paper's IID columns (Local-IID still runs: the gate's
#: bound) and Dir(0.1), which the paper never runs; the earlier profile's cells of both are in
#: previous/
ALTERNATIVES = {"iid": {"partition": "iid"}, "dir0.1": {"partition": "dirichlet", "alpha": 0.1}}
CLIENTS = 10
#: training images per device, chosen by recipes.py (recipes.md) on a validation split
PER_DEVICE = 1600
#: rounds, chosen by rounds.py (rounds.md) on a validation split for the hour (issue 37; was 12)
ROUNDS = 9
#: what this regeneration cost, measured (issue 37), and the quick profile's run (quick/)
MEASURED = (Path(__file__).resolve().parent / "MEASURED.md").read_text().strip() \
    if (Path(__file__).resolve().parent / "MEASURED.md").exists() else ""
#: what recipes.md measured (its numbers, quoted on the page)
RECIPE_FINDING = (
    "at 800 images per device Local-IID ends at 71–73 % on the validation split whatever the "
    "schedule (seed 10, ten devices: 71.5 % with the ×0.1 steps and without) or the passes over "
    "the data (one epoch per round instead of two: 72.35 ± 0.68 % over five seeds), its curve "
    "flat after the first ×0.1 step: it has learnt what 800 images teach this model. With 1,600 "
    "images per device at one epoch per round (the same sample visits) it ends at 76.86 ± 0.38 % "
    "(lowest 76.42 %, no collapse, last-quarter slope 0.03): the data per device is the lever."
)
#: method label → (algorithm, options). "-ko": knowledge only, no weights at all (what a fleet of
#: unique devices gets); the plain labels average weights among devices of one depth.
HETERO = {
    "local": ("local", {}),
    "fedhe": ("fedhe", {}),
    "felo": ("felo", {}),
    "velo": ("velo", {}),
    "felo-ko": ("felo", {"average_weights": "false"}),
    "velo-ko": ("velo", {"average_weights": "false"}),
}
RUN_ORDER = ("fedhe", "felo", "velo", "local", "felo-ko", "velo-ko")
HOMO = {"fedavg": ("fedavg", {}), "felo": ("felo", {}), "velo": ("velo", {})}


def profile(quick: bool) -> dict:
    """The paper's fleet made CPU-sized: ResNet10/14/18/22/26 with the authors' 7×7/2 stem at
    width 0.125 (64-d features), two devices per depth of :data:`PER_DEVICE` images, every device
    every round, one local epoch of Adam 1e-3 at batch 50 per round, ×0.1 at 40 % and 70 % of
    the rounds (the authors' MultiStepLR, scaled to the run). ``quick``: the same fleet of ten
    devices (two per depth, so that weights still average within a depth) on 300 images each,
    6 rounds."""
    base = benchmark_profile(quick, {
        "clients": CLIENTS,
        "fraction": 1.0,
        "rounds": ROUNDS,
        "epochs": 1,
        "train_samples": PER_DEVICE * CLIENTS,
        "eval_every": 1,
        "model": "resnet",
        "model_options": {"stem": "imagenet"},
        "width": 0.125,
        "optimizer": "adam",
        "lr": 1e-3,
        "batch_size": 50,
    }, {"clients": CLIENTS, "train_samples": 300 * CLIENTS, "rounds": 6, "eval_every": 1})
    base["lr_decay_rounds"] = decay_rounds(base["rounds"])
    return base


def make(quick: bool = False) -> Benchmark:
    base = profile(quick)
    settings = {**SETTINGS, **ALTERNATIVES}

    def cell(
        method,
        algorithm,
        options,
        setting,
        seed,
        tiers=DEPTHS,
        role="grid",
        extra=None,
        setting_name=None,
    ):
        config = {
            **base,
            **settings.get(setting, {}),
            "algorithm": algorithm,
            "options": dict(options),
            "tiers": tiers,
            **(extra or {}),
        }
        return Cell(method, setting_name or setting, seed, config, role)

    seeds = SEEDS if quick else SEEDS5
    cells = []
    # by method, every seed of one before the next, the paper's claims' pairs first: a run stopped
    # early leaves whole claims (three seeds of both sides) rather than one seed of everything
    for setting in SETTINGS:
        for method in RUN_ORDER:
            for seed in seeds:
                cells.append(cell(method, *HETERO[method], setting, seed))
    for method, (algorithm, options) in HOMO.items():
        for seed in seeds:
            cells.append(
                cell(
                    method,
                    algorithm,
                    options,
                    "dir0.5",
                    seed,
                    tiers=("18",),
                    setting_name="homo-dir0.5",
                )
            )

    # the upper bound: one ResNet18 on the union of the devices' data, the same sample visits
    centralized = [cell("centralized", "local", {}, "iid", 0, tiers=("18",), role="bound",
                        extra={"clients": 1}, setting_name="centralized")]
    local_iid = [cell("local", "local", {}, "iid", seed, role="bound") for seed in SEEDS]

    claims = []
    # the paper's CIFAR-10 numbers (ALGORITHMS.md): its non-IID is Dir(0.5)
    for setting in SETTINGS:
        num = {"iid": "IID", "dir0.5": "non-IID"}.get(setting)
        claims += [
            Claim(
                f"velo-gt-felo-{setting}",
                "velo > felo",
                setting,
                paper={
                    "iid": "+0.23 (76.33 vs 76.10, CIFAR-10 IID)",
                    "dir0.5": "+0.29 (57.17 vs 56.88, CIFAR-10 non-IID)",
                }.get(setting, "— (not run by the paper)"),
            ),
            Claim(
                f"felo-gt-fedhe-{setting}",
                "felo > fedhe",
                setting,
                paper="main-setting baselines in figures only"
                + (
                    "; extreme non-IID +13.66 (52.63 vs 38.97)"
                    if num != "IID"
                    else "; extreme IID: FedHe not reported"
                ),
            ),
            Claim(
                f"velo-gt-fedhe-{setting}",
                "velo > fedhe",
                setting,
                paper="main-setting baselines in figures only"
                + (
                    "; extreme non-IID +17.95 (56.92 vs 38.97)"
                    if num != "IID"
                    else "; extreme IID: FedHe not reported"
                ),
            ),
            Claim(
                f"velo-ko-gt-felo-ko-{setting}",
                "velo-ko > felo-ko",
                setting,
                note="knowledge only (no weights travel): the paper's extreme setting, every "
                "architecture unique",
                paper={"iid": "+3.68 (74.13 vs 70.45, extreme C10 IID)"}.get(
                    setting, "+4.29 (56.92 vs 52.63, extreme C10 non-IID)"
                ),
            ),
            Claim(
                f"felo-ko-gt-fedhe-{setting}",
                "felo-ko > fedhe",
                setting,
                note="knowledge only",
                paper="+13.66 (52.63 vs 38.97, extreme C10 non-IID)"
                if setting != "iid"
                else "extreme C10 IID: FedHe not reported",
            ),
            # non-inferiority rows (the benchmark's earlier reading; never counted)
            Claim(f"velo-ge-felo-{setting}", "velo ≥ felo", setting, kind="not worse"),
            Claim(f"velo-ko-ge-felo-ko-{setting}", "velo-ko ≥ felo-ko", setting, kind="not worse"),
        ]
        # every method against Local (the lower bound every federated method must clear)
        claims += [Claim(f"{m}-gt-local-{setting}", f"{m} > local", setting, kind="implied")
                   for m in ("fedhe", "felo", "velo", "felo-ko", "velo-ko")]
        claims.append(
            Claim(f"fedhe-ge-local-{setting}", "fedhe ≥ local", setting, kind="not worse")
        )
    claims += [  # the homogeneous table: ResNet18 everywhere, CIFAR-10 non-IID (Dir(0.5))
        Claim(
            "homo-felo-gt-fedavg",
            "felo > fedavg",
            "homo-dir0.5",
            paper="+1.13 (60.36 vs 59.23, C10 non-IID; IID −0.13)",
        ),
        Claim(
            "homo-velo-gt-fedavg",
            "velo > fedavg",
            "homo-dir0.5",
            paper="+1.65 (60.88 vs 59.23, C10 non-IID; IID +0.50)",
        ),
        Claim(
            "homo-velo-gt-felo",
            "velo > felo",
            "homo-dir0.5",
            paper="+0.52 (60.88 vs 60.36, C10 non-IID)",
        ),
        Claim("homo-felo-ge-fedavg", "felo ≥ fedavg", "homo-dir0.5", kind="not worse"),
        Claim("homo-velo-ge-fedavg", "velo ≥ fedavg", "homo-dir0.5", kind="not worse"),
    ]
    grid = fleet_text(base, quick, groups=("depth", 5))
    return Benchmark(
        name="felo_velo",
        title="Felo / Velo on Fashion-MNIST (Chan & Ngai)",
        description=f"""
Fleet: the paper's ResNet10/14/18/22/26 with the authors' 7×7/2 stem, **width 0.125** (64-d
features) on 28×28 Fashion-MNIST; {grid}; every device every round; one local epoch of Adam 1e-3
at batch 50 per round (the method's defaults), ×0.1 at rounds {base["lr_decay_rounds"][0] + 1} and \
{base["lr_decay_rounds"][1] + 1} (the authors' MultiStepLR at 40 % and 70 %, so the last quarter,
where convergence is read, comes after both); α = 0.5 (the authors' code), warm-up (CE only for
⌈5 %⌉ of rounds) and the CVAE as the method's defaults. Accuracy: mean over devices of each
device's model on the test images (the paper's metric) ({base["test_samples"]:,} test images).
Main settings: Dir(0.5) (the paper's non-IID, the headline of its heterogeneous and extreme
tables) and homo-Dir(0.5) (its homogeneous table's non-IID column); seeds {list(seeds)} (a seed
changes the partition, the initialisation and the sampling{"" if quick else FIVE}). Bounds:
centralized (one ResNet18 on the union of the devices' data, the same sample visits) and Local
on IID shards (seeds {list(SEEDS)}).

What changed from the paper, and why: the models are 1/8 of the paper's width and the data is
Fashion-MNIST on ten devices, to run on 2 cores; CIFAR-10's 20 clients held 2,500 images each and
trained 10 minibatches of 50 per participation. The profile before issue 37 gave each device 800
images for 12 rounds × 2 epochs, and its Local-IID ended at 72.1 %, under the protocol's 75 %.
[`recipes.md`](recipes.md) measures why, on a validation split, one lever at a time over five
seeds: {RECIPE_FINDING} The profile therefore gives each device {PER_DEVICE:,} images for one epoch
per round: the same sample visits per round as before, twice the data. To regenerate in about an
hour on 2 cores (issue 37) the grid keeps the paper's non-IID settings as main and declares two
alternatives, not run here: the IID setting (the paper's IID columns; only its Local runs, for the
gate) and Dir(0.1) (not in the paper). α is the authors' code value, not swept again: the earlier
profile's sweep over {{0.5, 1, 2}} (2 seeds, validation split) kept 0.5 for FedHe and Felo alike.
The earlier profile's cells of every setting, and its α sweep, are in
[`previous/`](previous/README.md).

The hour (issue 37): at 12 rounds the grid and bounds took 71.0 minutes in one invocation on this
project's 2-core machine, and under the schedule the last four rounds trained at lr 1e-5.
[`rounds.md`](rounds.md) chose {ROUNDS} rounds (the schedule scaled by the same rule) on a
validation split before any cell of this profile ran, by recipes.md's rule: Local-IID ≥ 76 % over
five seeds, no collapse, a flat last quarter; 8 rounds reached 75.26 %. The 12-round page is in
[`previous12/`](previous12/README.md), and every claim's sign is compared with it below.

{MEASURED}

Two paths are measured apart: **felo / velo** average weights among the devices of one depth
(the paper's step 5) besides the knowledge; **felo-ko / velo-ko** exchange knowledge only (no
weights at all), which is what a fleet of unique devices gets. **homo-dir0.5** is the homogeneous
table's analogue: ResNet18 on every device, FedAvg against Felo and Velo. Bytes are whole wire
envelopes per device and round (evaluation downlinks included).
""",
        cells=cells,
        claims=claims,
        sweeps=[],
        bounds={"centralized": centralized, "local_iid": local_iid},
        keep_server_metrics=(
            "cvae_fit",
            "cvae_fit_real",
            "cvae_spread",
            "cvae_loss",
            "architectures_averaged",
        ),
        diagnostics=diagnostics,
        command="python -m benchmarks.felo_velo" + (" --quick" if quick else ""),
        paper="Felo / Velo (Chan & Ngai, Exploiting Features and Logits in Heterogeneous FL)",
    )


def diagnostics(results: dict) -> str:
    """Velo − Felo per seed, and the CVAE's fit per round."""
    runs = results["runs"]
    lines = [
        "## The CVAE's value and fit",
        "",
        "Velo − Felo is what the CVAE adds. Its fit: a softmax classifier is fitted on the real "
        "feature "
        "points the CVAE learned from; `fit` is that classifier's accuracy on 50 generated "
        "features per "
        "class, `real` its accuracy on the real points (the ceiling), `spread` the generated "
        "features' mean "
        "distance to their class mean over the real points' (0: the CVAE gives one point per "
        "class, and Velo's "
        "target is then Felo's mean); mean over seeds and rounds of the second half.",
        "",
        "| setting | pair | Velo − Felo per seed (points) | mean | CVAE fit | real | spread |",
        "|---|---|---|---|---|---|---|",
    ]
    settings = list(dict.fromkeys(r["setting"] for r in runs))
    for setting in settings:
        for velo, felo in (("velo", "felo"), ("velo-ko", "felo-ko")):
            v = {r["seed"]: r for r in runs if r["setting"] == setting and r["method"] == velo}
            f = {r["seed"]: r for r in runs if r["setting"] == setting and r["method"] == felo}
            seeds = sorted(set(v) & set(f))
            if not seeds:
                continue
            diffs = [100 * (v[s]["final_accuracy"] - f[s]["final_accuracy"]) for s in seeds]
            fits, reals, spreads = [], [], []
            for s in seeds:
                pr = v[s]["per_round"]
                half = [
                    p["server"]
                    for p in pr[len(pr) // 2 :]
                    if "server" in p and "cvae_fit" in p["server"]
                ]
                fits += [h["cvae_fit"] for h in half if h["cvae_fit"] is not None]
                reals += [h["cvae_fit_real"] for h in half if h.get("cvae_fit_real") is not None]
                spreads += [h["cvae_spread"] for h in half if h.get("cvae_spread") is not None]
            fit = f"{100 * statistics.fmean(fits):.1f} %" if fits else "—"
            real = f"{100 * statistics.fmean(reals):.1f} %" if reals else "—"
            spread = f"{statistics.fmean(spreads):.2f}" if spreads else "—"
            lines.append(f"| {setting} | {velo} − {felo} | " + ", ".join(f"{d:+.2f}" for d in diffs)
                         + f" | {statistics.fmean(diffs):+.2f} | {fit} | {real} | {spread} |")
    lines += ["", *knowledge_only(runs), "", *against_previous(results)]
    lines += [
        "",
        "## Traffic per device and round",
        "",
        "| setting | method | up B | down B |",
        "|---|---|---|---|",
    ]
    for setting in settings:
        for method in dict.fromkeys(r["method"] for r in runs if r["setting"] == setting):
            rs = [r for r in runs if r["setting"] == setting and r["method"] == method]
            up = mean_sd([r["bytes_up_per_device_round"] for r in rs])[0]
            down = mean_sd([r["bytes_down_per_device_round"] for r in rs])[0]
            lines.append(f"| {setting} | {method} | {up:,.0f} | {down:,.0f} |")
    return "\n".join(lines)


def held_classes(config: dict) -> dict[str, tuple[int, int]]:
    """Per device: (how many classes make up at least 2 % of its training images, how many classes
    the data has), rebuilt from the run's configuration (same seed, same partition)."""
    return {d: (sum(c >= 0.02 * sum(counts) for c in counts), len(counts))
            for d, (_, counts) in device_class_counts(config).items()}


#: held-class bins of the knowledge-only table
BINS = ((1, 2), (3, 5), (6, 9), (10, 10))


def knowledge_only(runs: list[dict]) -> list[str]:
    """Why ``felo-ko > fedhe`` holds on IID and not under Dirichlet splits: per device, the
    knowledge-only gain against the number of classes the device holds. Both methods' terms act
    only on a device's own samples (targets s̄_y, p̄_y for its labels y), so the features can
    sharpen the classes a device has and teach nothing of those it lacks."""
    by = {(r["method"], r["setting"], r["seed"]): r for r in runs}
    rows, settings = [], list(dict.fromkeys(r["setting"] for r in runs if r["method"] == "felo-ko"))
    split = {"all": [], "some": []}  # felo-ko − fedhe of devices holding every class / not
    for setting in settings:
        seeds = sorted(
            s for (m, st, s) in by if m == "felo-ko" and st == setting and ("fedhe", st, s) in by
        )
        points = []  # (held classes, classes, felo-ko − fedhe, felo − fedhe) per device, in points
        for seed in seeds:
            ko, he, fe = (
                by[("felo-ko", setting, seed)],
                by[("fedhe", setting, seed)],
                by.get(("felo", setting, seed)),
            )
            held = held_classes(ko["config"])
            for d, (n, classes) in held.items():
                points.append(
                    (
                        n,
                        classes,
                        100 * (ko["client_accuracy"][d] - he["client_accuracy"][d]),
                        100 * (fe["client_accuracy"][d] - he["client_accuracy"][d]) if fe else None,
                    )
                )
        for n, classes, gain, _ in points:
            split["all" if n == classes else "some"].append(gain)
        for lo, hi in BINS:
            pts = [p for p in points if lo <= p[0] <= hi]
            if not pts:
                continue
            fe = [p[3] for p in pts if p[3] is not None]
            rows.append(
                f"| {setting} | {lo}–{hi} | {len(pts)} | "
                f"{statistics.fmean(p[2] for p in pts):+.2f} | "
                + (f"{statistics.fmean(fe):+.2f}" if fe else "—")
                + " |"
            )
    reading = []
    if split["all"] and split["some"]:
        some = split["some"]
        reading = [
            "",
            f"Measured: on devices that hold every class the feature term changes accuracy by "
            f"{statistics.fmean(split['all']):+.2f} points (mean of {len(split['all'])}); on "
            "devices that lack "
            f"some, by {statistics.fmean(some):+.2f} ({len(some)} devices, "
            f"{sum(g < 0 for g in some)} of them "
            "negative). The knowledge-only path carries nothing about a "
            "class a device lacks, and the class means it pulls towards are averaged over devices "
            "of other "
            "depths and other class mixtures; what lifts Felo above FedHe under the Dirichlet "
            "splits is the "
            "weights averaged within a depth, which carry the other devices' classes (last "
            "column).",
        ]
    return [
        "## Knowledge only: what the features add to FedHe's logits, by the classes a device holds",
        "",
        "`felo-ko` differs from `fedhe` only by the feature term α·MSE(s(x), s̄_y); no weights "
        "travel in either. "
        "Both terms act on a device's own samples only (their targets are the server's statistics "
        "for the "
        "sample's label). Per device (all seeds), its accuracy difference against FedHe on the "
        "same partition, "
        "grouped by how many classes make up ≥ 2 % of its training images (rebuilt from each run's "
        "configuration); `felo − fedhe` adds the weights averaged within a depth, for comparison.",
        "",
        "| setting | classes held | devices | felo-ko − fedhe (points) | felo − fedhe (points) |",
        "|---|---|---|---|---|",
        *rows,
        *reading,
    ]


#: the earlier profile's results (the same fleet at 12 rounds; issue 37's hour)
PREVIOUS = Path(__file__).resolve().parent / "previous12" / "results.json"


def against_previous(results: dict) -> list[str]:
    """Each claim's sign here against the 12-round profile's (``previous12/results.json``)."""
    return pages.against_previous(
        results, PREVIOUS, "## Against the 12-round profile (the sign of every claim)",
        "The cells committed before this profile (`previous12/`: the same fleet, data, models and "
        "seeds at 12 rounds, ×0.1 before rounds 6 and 9; 71.0 min to regenerate here)")
