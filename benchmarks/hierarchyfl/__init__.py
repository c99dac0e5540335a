"""HierarchyFL (hierarchical self-distillation) against HeteroFL on real Fashion-MNIST, under the
benchmark protocol (issue 15). Run it with ``python -m benchmarks.hierarchyfl`` (``--quick`` for
the few-minute profile).

The cells' hook, :func:`benchmarks.hierarchyfl.extras.extras`, keeps what the server step
reports each round: the meta-learner's weights M (they must move away from uniform), its
gradient, and each exit's accuracy on the server's check split (half of its public set, kept out
of the step) right before and right after the step (server metrics ``check_*``). The page's own
sections are in :mod:`benchmarks.hierarchyfl.page`.
"""

from __future__ import annotations

from benchmarks.common import benchmark_profile, decay_rounds
from benchmarks.runner import (
    Benchmark,
    Cell,
    Claim,
    Sweep,
    paired_difference,
)

SEEDS = (0, 1, 2)
DEPTH = ("1", "2", "3", "4")
WIDTH = ("1/8", "1/4", "1/2", "1")
#: Every setting of the claims runs 20 rounds (÷10 at 40 % and 70 %: before rounds 9 and 15),
#: declared (issue 37) for the hour on 2 cores: the 32-round profile (÷10 before rounds 14 and 23)
#: measured about 77 minutes even on the faster of this project's machines (rounds.py's docstring),
#: and rounds.md chose 20 on a validation split by a rule fixed before its runs (Local-IID 77.93 %,
#: HierarchyFL at Dir(0.1) 67.53 %, slopes 0.02 and −0.15). The 32 rounds came from the earlier
#: schedule at 20 rounds, where HierarchyFL was still climbing at Dir(0.1) (method slope 0.58) and
#: Dir(0.5)'s last quarter held 3 evaluations (slopes 0.61–0.66); with the scaled schedule its
#: validation curve at 20 rounds is flat.
ROUNDS = 20
LONG = {"rounds": ROUNDS, "lr_decay_rounds": decay_rounds(ROUNDS)}
#: The stem check (``stem_check.py``) ran (and stays cached) at the 32-round profile
RECHECKED_AT = {"rounds": 32, "lr_decay_rounds": decay_rounds(32)}
#: The public set of the paper's size: 1 % of Fashion-MNIST's 60,000 training images = 600 for the
#: server step, 600 more held out as its check split, carved from 7,200 images so that the devices
#: keep 6,000. Both methods lose the same carve-out.
PAPER_PUBLIC = {"train_samples": 7200, "public_fraction": 1 / 6}
#: The quick profile (``--quick``, issue 37: the main claims' signs in under 10 minutes) runs the
#: full profile's fleet, data and main Dir(0.1) setting for 6 rounds (×0.1 at rounds 3 and 5), two
#: seeds. In the full profile HierarchyFL's lead over HeteroFL shows at rounds 2 and 4 in every seed
#: and tier (+5 to +42 points at Dir(0.1)). The profile it replaces (4 devices of 500 images, a
#: public set of 20 + 20 images, 4 rounds with the ×0.1 steps after rounds 2 and 3) showed none of
#: it, and neither did the same with a public set of 200 + 200 images (at bff3a09): there the
#: server step was 7 SGD steps a round where the full profile's is 19, and it lifted the exits'
#: check accuracy by under 3 points a round, where the full profile's lifts it by 21-32.
QUICK_ROUNDS = 6
#: The second reading of the public set (a main setting, counted), the benchmark's first: 2 % of
#: 6,000 images: 60 for the server step (the paper's 1 % of *these* devices' data), 60 for the
#: check. Its earlier cells ran 20 rounds at Dir(0.1) and IID; the profile declared for issue 37
#: runs every setting of both readings :data:`ROUNDS` rounds.
SMALL = "-public60"
SMALL_PUBLIC = {"train_samples": 6000, "public_fraction": 0.02}
SETTINGS = {
    "dir0.1": {"partition": "dirichlet", "alpha": 0.1, **PAPER_PUBLIC, **LONG},
    "dir0.5": {"partition": "dirichlet", "alpha": 0.5, **PAPER_PUBLIC, **LONG},
    "iid": {"partition": "iid", **PAPER_PUBLIC, **LONG},
    "dir0.1" + SMALL: {"partition": "dirichlet", "alpha": 0.1, **SMALL_PUBLIC, **LONG},
    "dir0.5" + SMALL: {"partition": "dirichlet", "alpha": 0.5, **SMALL_PUBLIC, **LONG},
    "iid" + SMALL: {"partition": "iid", **SMALL_PUBLIC, **LONG},
}
#: Seeds per setting (issue 37): five at Dir(0.1) and Dir(0.5), in both readings, where the
#: earlier runs' per-tier accuracy spread over seeds by more than 5 points (HeteroFL's tiers:
#: sd 6-9 at Dir(0.1), up to 14 at Dir(0.5)); three at IID (sd under 1.5).
SEEDS5 = (0, 1, 2, 3, 4)


def seeds_of(setting: str) -> tuple[int, ...]:
    return SEEDS if setting.startswith("iid") else SEEDS5


#: The model of the profile declared for issue 37's one-hour rule: the CIFAR stem's 3×3 conv at
#: stride 2 (``stem=stride2``: the same parameters, half the resolution from the first stage on),
#: about a third of the CPU cost of the stride-1 stem the earlier cells ran with (4 rounds of this
#: fleet, process time: HeteroFL 15.8 s against 50.3 s, HierarchyFL 19.5 s against 64.5 s).
STEM = {"model_options": {"stem": "stride2"}}
#: The quick profile's one sweep (a smoke check of the sweep end to end) runs as the sweeps of the
#: earlier profiles ran: the stride-1 stem, from the errata's server lr 0.005 and T = 3
#: (:data:`SWEPT_AT`).
SWEPT_MODEL = {"model_options": {}}
#: The full profile's sweeps (declared for issue 37's last pass, before their cells ran) choose the
#: server step's defaults at the profile itself: the stride-2 stem, :data:`ROUNDS` rounds with the
#: decay, Dir(0.1) with the 600-image public set, on a validation split of 1,000 training images,
#: seeds 0 and 1, each value varied alone from the defaults (the defaults' own cells shared).
SWEEP_SEEDS = (0, 1)
#: The width tiers (``width-*``: a "not worse than" row, never a counted claim) are a declared
#: alternative, not run by the declared profile (cost, issue 37).
RUN_WIDTH = False
CLAIMED = ("dir0.1", "dir0.5", "iid")  # the claims' settings
#: Table I, CIFAR-10, HierarchyFL − HeteroFL (the paper reports HeteroFL for Models 1 and 4 only)
PAPER_TABLE = {
    ("dir0.1", "1"): "+20.03 (69.43 vs 49.40, CIFAR-10 α 0.1, Model 1)",
    ("dir0.1", "2"): "— (HeteroFL not reported; HierarchyFL 76.91)",
    ("dir0.1", "3"): "— (HeteroFL not reported; HierarchyFL 83.18)",
    ("dir0.1", "4"): "+7.57 (82.90 vs 75.33, CIFAR-10 α 0.1, Model 4)",
    ("dir0.5", "1"): "+6.30 (81.33 vs 75.03, CIFAR-10 α 0.5, Model 1)",
    ("dir0.5", "2"): "— (HeteroFL not reported; HierarchyFL 84.25)",
    ("dir0.5", "3"): "— (HeteroFL not reported; HierarchyFL 86.86)",
    ("dir0.5", "4"): "−0.83 (86.92 vs 87.75, CIFAR-10 α 0.5, Model 4)",
    ("iid", "1"): "+0.55 (86.41 vs 85.86, CIFAR-10 IID, Model 1)",
    ("iid", "4"): "+0.41 (89.62 vs 89.21, CIFAR-10 IID, Model 4)",
}
BETAS = (0.0, 0.1, 1.0, 10.0)
TEMPERATURES = (1.0, 3.0)
SERVER_LRS = (0.005, 0.05)
GAIN = "gain:dir0.1"
#: half of the server's public set is held out of its step, to measure the step
CHECK = {"check_share": "0.5"}
#: The benchmark ran (and stays cached) with the global model's averaged BatchNorm statistics, from
#: before the devices recalibrated them (the methods' default ``bn_stats=recalibrate`` since): set
#: for both methods, so HeteroFL and HierarchyFL are compared on the same footing as before.
BN_STATS = {"bn_stats": "average"}
#: Where the quick profile's sweep starts: the errata's server lr 0.005 and T = 3.
SWEPT_AT = {"server_lr": "0.005", "temperature": "3"}


def profile(quick: bool) -> dict:
    """Multi-exit ResNet-18 hierarchies at width 0.125, eight devices (two per tier) of about 740
    images, every device every round, one local epoch of SGD 0.05 (momentum 0.9, weight decay
    5e-4) at batch 32 per round; the same 2 % of the training images carved out for both methods
    (HierarchyFL's labelled public set: half of it for the server step, the paper's 1 %, half held
    out as the server's check split), so both train on identical device partitions."""
    if quick:  # the full profile's fleet and data, fewer rounds (:data:`QUICK_ROUNDS`)
        return {**profile(False), "rounds": QUICK_ROUNDS}
    return benchmark_profile(False, {
        "width": 0.125,
        "clients": 8,
        "fraction": 1.0,
        "rounds": 20,
        "optimizer": "sgd",
        "lr": 0.05,
        "momentum": 0.9,
        "weight_decay": 5e-4,
        "batch_size": 32,
        "eval_every": 2,
        "public_fraction": 0.02,
        **STEM,
    })


def make(quick: bool = False) -> Benchmark:
    # the page's sections read this module's settings (imported here: no import circle)
    from benchmarks.hierarchyfl.page import diagnostics, figures

    base = profile(quick)
    decay = decay_rounds(base["rounds"])
    # the quick profile: the main settings of the same name at QUICK_ROUNDS rounds
    table = (
        {s: {**SETTINGS[s], "rounds": QUICK_ROUNDS, "lr_decay_rounds": decay}
         for s in ("dir0.1", "iid")}
        if quick
        else SETTINGS
    )
    seeds = SEEDS[:2] if quick else SEEDS

    def cell(
        method, setting, seed, *, family="depth", options=None, role="grid", extra=None, name=None
    ):
        algorithm = (
            "heterofl"
            if method.startswith("heterofl")
            else "local"
            if method.startswith("local")
            else "hierarchyfl"
        )
        model, tiers = (
            ("hierarchy-depth", DEPTH) if family == "depth" else ("hierarchy-width", WIDTH)
        )
        options = {
            **(BN_STATS if algorithm != "local" else {}),
            **(CHECK if algorithm == "hierarchyfl" else {}),
            **(options or {}),
        }
        config = {
            **base,
            **table[setting],  # the rounds and their decay included
            "algorithm": algorithm,
            "model": model,
            "tiers": tiers,
            "options": options,
            **(extra or {}),
        }
        return Cell(method, name or setting, seed, config, role)

    # Table II: averaging (HeteroFL) / + ensemble logits / + logits and features
    def ablation(setting, seed):
        return [cell("hierarchyfl-logits", setting, seed, options={"ensemble": "logits"})]

    def width(setting, seed):
        return [
            cell(m, setting, seed, family="width", name=f"width-{setting}")
            for m in ("hierarchyfl-width", "heterofl-width")
        ]

    cells = []
    claimed = ("dir0.1",) if quick else CLAIMED
    for s in claimed:  # the claims' settings first: an interrupted run keeps them
        for seed in seeds if quick else seeds_of(s):
            cells += [cell("hierarchyfl", s, seed), cell("heterofl", s, seed)]
    # the ablation, and (not the paper's) the server step with the public labels' CE alone
    for seed in seeds if quick else SEEDS5:
        cells += ablation("dir0.1", seed)
        if not quick:
            cells.append(cell("hierarchyfl-labels", "dir0.1", seed, options={"ensemble": "labels"}))
    if not quick:
        for s in CLAIMED:  # the small public set (the benchmark's first runs), the second reading
            for seed in seeds_of(s):
                cells += [cell(m, s + SMALL, seed) for m in ("hierarchyfl", "heterofl")]
        for seed in SEEDS5:
            cells += ablation("dir0.1" + SMALL, seed)
            cells.append(cell("hierarchyfl-labels", "dir0.1" + SMALL, seed,
                              options={"ensemble": "labels"}))
        for seed in SEEDS if RUN_WIDTH else ():
            cells += width("dir0.1" + SMALL, seed) + width("dir0.1", seed)
    centralized = [
        cell(
            "local", "iid", 0, role="bound", name="centralized", extra={"clients": 1, "tiers": (t,)}
        )
        for t in (DEPTH[-1:] if quick else DEPTH)
    ]
    local_iid = [cell("local", "iid", seed, role="bound", name="local-iid") for seed in seeds]

    sweep_seeds = (0,) if quick else SWEEP_SEEDS
    validation = {"validation_samples": 200 if quick else 1000}
    # quick: from the errata's values, the stride-1 stem; full: from the defaults, the profile's
    start, model = (SWEPT_AT, SWEPT_MODEL) if quick else ({}, {})

    def sweep(parameter, grid, option, note, default):
        """Each value of ``grid`` for ``option`` alone (the default: the defaults' own cells), on
        Dir(0.1)'s validation split with the 600-image public set."""
        grid = grid[:2] if quick else grid

        def options(v):
            return {**start, **({} if v == default and not quick else {option: str(v)})}

        return Sweep(
            parameter,
            grid,
            {
                v: [
                    cell("hierarchyfl", "dir0.1", seed, options=options(v), role="sweep",
                         extra={**validation, **model}, name="sweep-dir0.1")
                    for seed in sweep_seeds
                ]
                for v in grid
            },
            note=note + "; Dir(0.1) with the 600-image public set, validation split",
            default=default if default in grid else None,
        )

    sweeps = [sweep("hierarchyfl.beta", BETAS, "beta", "weight of the feature terms", 1.0)]
    if not quick:  # the smoke profile checks one sweep end to end
        sweeps += [
            sweep("hierarchyfl.temperature", TEMPERATURES, "temperature",
                  "T of the logit distillation", 1.0),
            sweep("hierarchyfl.server_lr", SERVER_LRS, "server_lr",
                  "the server step's lr (no momentum)", 0.05),
        ]
    # Both readings of the paper's public set are main settings, side by side and both counted
    # (issue 37): 600 images (1 % of Fashion-MNIST's 60,000, the paper's absolute size) and 60
    # images (1 % of these devices' 6,000, the paper's ratio; "-public60").
    readings = ("",) if quick else ("", SMALL)
    claims = []
    for r in readings:
        for s in ("dir0.1", "dir0.5", "iid"):
            if s not in claimed:
                continue
            for t in DEPTH:
                number = PAPER_TABLE.get((s, t))
                if number is None:
                    continue
                # the paper's own table has HierarchyFL below HeteroFL here
                if number.startswith("−"):
                    claims.append(
                        Claim(
                            f"hierarchyfl-ge-heterofl-{s}{r}-tier{t}",
                            "hierarchyfl ≥ heterofl",
                            s + r,
                            metric=f"per_tier.{t}",
                            kind="not worse",
                            paper=number,
                        )
                    )
                else:
                    claims.append(
                        Claim(
                            f"hierarchyfl-gt-heterofl-{s}{r}-tier{t}",
                            "hierarchyfl > heterofl",
                            s + r,
                            metric=f"per_tier.{t}",
                            paper=number,
                        )
                    )
        claims += [
            Claim(
                f"ablation-logits-gt-averaging{r}",
                "hierarchyfl-logits > heterofl",
                "dir0.1" + r,
                note="Table II: + ensemble logits against averaging only (mean over tiers)",
                paper="+1.95 (49.04 vs 47.09, CIFAR-100 α 0.1, Model 4)",
            ),
            Claim(
                f"ablation-features-gt-logits{r}",
                "hierarchyfl > hierarchyfl-logits",
                "dir0.1" + r,
                note="Table II: + logits and features against + logits",
                paper="+3.52 (52.56 vs 49.04, CIFAR-100 α 0.1, Model 4)",
            ),
            Claim(
                f"ablation-features-ge-logits{r}",
                "hierarchyfl ≥ hierarchyfl-logits",
                "dir0.1" + r,
                kind="not worse",
            ),
        ]
        if not quick and RUN_WIDTH:
            claims.append(
                Claim(
                    f"width-not-below-heterofl{r}",
                    "hierarchyfl-width ≥ heterofl-width",
                    "width-dir0.1" + r,
                    kind="not worse",
                    note="width tiers: must not fall below HeteroFL",
                )
            )
    claims += [
        Claim(
            f"gain-smallest-tier-vs-{t}",
            "gain > gain",
            GAIN,
            metric_a="per_tier.1",
            metric_b=f"per_tier.{t}",
            note=f"HierarchyFL − HeteroFL at Dir(0.1): tier 1 against tier {t}",
            paper="+12.46 (gain +20.03 at Model 1 vs +7.57 at Model 4, CIFAR-10 α 0.1)"
            if t == "4"
            else "HeteroFL not reported for Models 2–3",
            kind="paper" if t == "4" else "implied",
        )
        for t in DEPTH[1:]
    ]
    if not quick:
        claims += [
            Claim(
                "control-distillation-gt-labels" + r,
                "hierarchyfl > hierarchyfl-labels",
                "dir0.1" + r,
                kind="control",
                note="the same server step with the public labels' CE alone: what the "
                "distillation adds over the labels HeteroFL never sees",
            )
            for r in ("", SMALL)
        ]

    def derived(runs: list[dict]) -> list[dict]:
        return paired_difference(
            runs, "hierarchyfl", "heterofl", "dir0.1", method="gain", as_setting=GAIN
        )

    if quick:
        fleet = (
            "8 devices (two per tier), 6,000 training images (about 740 per device), "
            f"{QUICK_ROUNDS} rounds (the lr ×0.1 at rounds {decay[0] + 1} and {decay[1] + 1}), "
            "Dir(0.1) with the public set of 600 + 600 images only"
        )
    else:
        fleet = (
            f"8 devices (two per tier), 6,000 training images (about 740 per device), {ROUNDS} "
            "rounds, the lr "
            f"×0.1 at rounds {LONG['lr_decay_rounds'][0] + 1} and "
            f"{LONG['lr_decay_rounds'][1] + 1} (40 % and 70 % of the "
            "rounds: the paper's ×0.1 steps scaled to the run, so the last quarter, where "
            "convergence is read, "
            "comes after both; HierarchyFL's server step follows the same schedule, and so do the "
            "bounds)"
        )
    seeds_text = str(list(seeds)) if quick else (
        f"{list(SEEDS5)} at Dir(0.1) and Dir(0.5) in both readings (the earlier runs' per-tier "
        f"accuracy spread over seeds by more than 5 points there), {list(SEEDS)} at IID and for "
        "Local-IID"
    )
    return Benchmark(
        name="hierarchyfl",
        title="HierarchyFL vs HeteroFL on Fashion-MNIST",
        description=f"""
Fleet: multi-exit ResNet-18 at **width 0.125** with the CIFAR stem's conv **at stride 2**
(`stem=stride2`: half the resolution from the first stage on, about a third of the stride-1 stem's
CPU cost, chosen for cost alone so the benchmark regenerates within an hour on 2 cores; checked on
a validation split by `stem_check.py` before its cells run), depth tiers 1–4 (exit i = Model i);
{fleet}; every device every round; one local epoch of SGD lr 0.05 (momentum 0.9, weight decay 5e-4)
at batch 32 per round. The rounds were cut from 32 for cost alone (the 32-round grid measured about
77 min on this project's 2-core Zen 4, [`cost32/`](cost32/README.md)): [`rounds.md`](rounds.md)
chose {ROUNDS} on a validation split by a rule fixed before its cells ran, and the 32-round page is
in [`previous32/`](previous32/README.md), every claim's sign compared with it below. The width
tiers (1/8, 1/4, 1/2, 1; a "not worse than" row, never a counted claim) are a declared
alternative, not run in this profile (cost).

**The public set has the paper's size**: 1 % of Fashion-MNIST's 60,000 training images, 600 for
HierarchyFL's server step, and 600 more held out as the server's check split (each exit's accuracy
right before and right after the step), carved stratified from 7,200 images so the devices keep
6,000. The same 1,200 images are carved out for HeteroFL, so both methods train on identical
device partitions with the same tier assignment and local budget. HierarchyFL's server step runs at
the method's defaults: SGD without momentum (the errata), CE on the public labels for every exit
besides the distillation terms, server lr 0.05 and T = 1 (chosen by the sweeps below).

Settings: Dir(0.1), Dir(0.5) (the claims) and IID (reference); the bounds train on the IID
setting's 6,000 device images. Table II's ablation at Dir(0.1): **heterofl** (averaging only),
**hierarchyfl-logits** (+ ensemble logits), **hierarchyfl** (+ logits and features); and a control
that is not the paper's, **hierarchyfl-labels**: the same server step with the public labels' CE
alone (no ensemble, no distillation), which tells what the public labels give from what the
distillation adds; it decides whether the gain is the distillation's, so it is counted as a claim.
**Two readings of the paper's public set, both main settings, side by side and both counted**: 600
images (1 % of Fashion-MNIST's 60,000, the paper's absolute size; the settings without a suffix) and
**…{SMALL}**: 1 % of these devices' data, 2 % of 6,000 images (60 for the step, 60 for the check;
the same {ROUNDS} rounds and schedule as the 600-image settings: the earlier 60-image cells at \
Dir(0.1) and IID ran 20). The benchmark first
ran the 60-image reading, its claims did not hold there, and the main setting became 600 images
afterwards: choosing between the readings after seeing results is what counting both undoes. The
labels-only control runs in both readings (at 60 images since the declaration of issue 37's
second pass, before its cells ran). The sweeps that choose the server step's defaults run with
this profile itself (declared for issue 37's last pass, before their cells ran): Dir(0.1) with the
600-image public set, a validation split of 1,000 training images, seeds {list(SWEEP_SEEDS)}, each
value varied alone from the defaults; the earlier sweeps, with the stride-1 stem, are in
[`sweeps_stride1.md`](sweeps_stride1.md). Seeds
{seeds_text}.

Both methods evaluate the global sub-models with the global model's averaged BatchNorm statistics
(`bn_stats=average`, the methods' default when this benchmark began; devices now recalibrate them
on their own data by default, see `quick_defaults/results.md`). Accuracy: each device's exit on
{base["test_samples"]:,} test images, per tier and mean over devices (= mean over tiers, equal
devices per tier). **gain**: HierarchyFL − HeteroFL per seed at Dir(0.1). The meta-learner's
weights M per round are in each run's `meta_weights`; each exit's accuracy on the check split
before and after the server step is in `distillation` (`check_before_<tier>`,
`check_after_<tier>`, `check_change`).
""",
        cells=cells,
        claims=claims,
        sweeps=sweeps,
        bounds={"centralized": centralized, "local_iid": local_iid},
        derived=derived,
        record_extras="benchmarks.hierarchyfl.extras:extras",
        diagnostics=diagnostics,
        figures=figures,
        command="python -m benchmarks.hierarchyfl" + (" --quick" if quick else ""),
        paper="HierarchyFL (Xia et al., hierarchical self-distillation)",
    )
