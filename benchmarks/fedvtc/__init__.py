"""FedVTC (variational transfer of class knowledge) against FedProto and Local on real
Fashion-MNIST, under the benchmark protocol (issue 17). Run it with ``python -m benchmarks.fedvtc``
(``--quick`` for the few-minute profile).

:func:`extras` adds to every run what the claims need beyond the final accuracy: the accuracy
right before the synthetic fine-tune, the bytes per device over the whole run (the one-shot ψ
upload and the final broadcast included) and, once the method reports it, the oracle metric.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from benchmarks.common import benchmark_profile, decay_rounds, fleet_text
from benchmarks.fedvtc import oracle
from benchmarks.runner import ROOT, Benchmark, Cell, Claim, RunOutput, Sweep

SEEDS = (0, 1, 2)
#: the CNN family's recipe (benchmarks/foundation/recipes.md), for FedProto and Local
BASELINE = {"lr": 0.01, "momentum": 0.9}
HETERO = ("1", "2", "3", "4", "5")
SETTINGS = {"dir0.1": {"partition": "dirichlet", "alpha": 0.1},
            "dir1": {"partition": "dirichlet", "alpha": 1.0}}
METHODS = ("fedvtc", "fedvtc-le", "fedvtc-psi-round", "fedproto", "local", "fedvtc-tc0")
TC_WEIGHTS = (0.01, 0.1, 1.0)
#: the issue's grid: tc_weight × lr {1e-3, 1e-4} (the paper's MNIST lr over 100 rounds × 5 epochs)
LRS = (1e-3, 1e-4)
#: At this budget (24 rounds × one epoch of ~600 images) plain SGD at 1e-3 and 1e-4 leaves every
#: model near chance, so the sweep also tries 1e-2 and 1e-1 (plain SGD at 0.1 is about the step of
#: the baselines' lr 0.01 with momentum 0.9). There tc_weight 0.01 already diverges at lr 0.1 (NaN
#: losses from round 1), so the larger weights are not tried; the smaller ones are: L_tc sums over
#: 784 pixels and p = 980 latent dims, its gradient on f_k ~25× CE's at the start.
EXTENDED = [(w, lr) for w in (0.01, 0.001, 0.0001) for lr in (1e-1, 1e-2)]
#: Adam (lr 1e-3) for f_k: its steps do not grow with the loss's scale, so the paper's weight 1 on
#: L_tc can be tried at this budget without the SGD runs' divergence
ADAM = [(w, 1e-3, "adam") for w in TC_WEIGHTS]
#: The second sweep: making the averaged ψ decode the global prototypes (SWEEP.md). Every ψ_k
#: learns only its own device's latents, which lie away from the global c^y, so their average
#: decoded one image for every class. proto_rc_weight also trains each ψ_k to decode
#: v ~ N(c^y, σ²) into its device's images of class y (the same input region on every device);
#: psi_bn=recalibrate re-estimates the averaged ψ's BatchNorm statistics on such latents. Run at the
#: first sweep's best-training setting (plain SGD 0.1, tc_weight 0.001).
DECODER = [(0.0, "average"), (0.0, "recalibrate"), (1.0, "recalibrate"), (10.0, "recalibrate")]
DECODER_BASE = {"optimizer": "sgd", "lr": 0.1, "momentum": 0.0}
#: the paper's decoder (the first sweep ran with it, before the options existed)
PAPER_DECODER = {"proto_rc_weight": "0", "psi_bn": "average"}


#: The row a reader must see: FedVTC ends below Local at Dir(1) (issue 37). What is measured about
#: it is on the page ("What the claims turn on"): FedVTC's accuracy before its fine-tune against
#: FedProto after the same rounds of real data, and fedvtc-tc0 (f_k without L_tc).
LOCAL_NOTE = (
    "FedVTC ends below Local here: the gap is decomposed per seed, term by term, in 'FedVTC "
    "against Local' "
    "below (the fine-tune, L_tc's cost to f_k, the rest of FedVTC's training against FedProto's, "
    "FedProto's "
    "extra rounds, FedProto against Local); not fixed"
)


def below_local(runs: list[dict]) -> list[str]:
    """FedVTC − Local per setting, as a sum of measured differences (each paired by seed): the
    fine-tune (after − before), L_tc's cost to f_k (FedVTC − fedvtc-tc0, both before their
    fine-tunes), the rest of FedVTC's training against FedProto's after the same rounds
    (fedvtc-tc0 before − FedProto at round R), FedProto's 𝒯 extra rounds (at R − final) and
    FedProto − Local. The terms add up to FedVTC − Local exactly."""
    import statistics

    by = {(r["setting"], r["method"], r["seed"]): r for r in runs if r.get("role") == "grid"}
    names = (
        "fine-tune",
        "L_tc on f_k",
        "rest of the training vs FedProto's",
        "FedProto at R − final",
        "FedProto − Local",
    )
    lines = [
        "## FedVTC against Local",
        "",
        "FedVTC − Local in points, per seed, as the sum of five measured differences: "
        "**fine-tune** (FedVTC after − "
        "before its synthetic fine-tune), **L_tc on f_k** (FedVTC − fedvtc-tc0, both before their "
        "fine-tunes), "
        "**rest of the training vs FedProto's** (fedvtc-tc0 before its fine-tune − FedProto after "
        "the same R rounds), "
        "**FedProto at R − final** (FedProto's 𝒯 extra rounds, negated) and **FedProto − Local**. "
        "Mean over seeds.",
        "",
        "| setting | FedVTC − Local | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for setting in dict.fromkeys(k[0] for k in by):
        rows = []
        for seed in sorted({k[2] for k in by if k[0] == setting}):
            v, t0, fp, lo = (
                by.get((setting, m, seed)) for m in ("fedvtc", "fedvtc-tc0", "fedproto", "local")
            )
            if not (v and t0 and fp and lo) or None in (
                v.get("accuracy_before_finetune"),
                t0.get("accuracy_before_finetune"),
            ):
                continue
            rounds = v["resolved_config"]["rounds"]
            at_r = next((p.get("accuracy") for p in fp["per_round"] if p["round"] == rounds), None)
            if at_r is None:
                continue
            terms = (v["final_accuracy"] - v["accuracy_before_finetune"],
                     v["accuracy_before_finetune"] - t0["accuracy_before_finetune"],
                     t0["accuracy_before_finetune"] - at_r, at_r - fp["final_accuracy"],
                     fp["final_accuracy"] - lo["final_accuracy"])
            total = v["final_accuracy"] - lo["final_accuracy"]
            if abs(sum(terms) - total) > 1e-9:
                raise AssertionError(
                    f"below_local: the terms of {setting} seed {seed} do not add up"
                )
            rows.append((total, terms))
        if rows:
            mean = [statistics.fmean(100 * r[1][i] for r in rows) for i in range(len(names))]
            lines.append(f"| {setting} | {statistics.fmean(100 * r[0] for r in rows):+.2f} | "
                         + " | ".join(f"{m:+.2f}" for m in mean) + " |")
    return lines


def extras(run: RunOutput) -> dict[str, Any]:
    """``accuracy_before_finetune``: the evaluation after the last training round (before the
    closing round and the fine-tune; on the same images as the final one, since the profile's
    eval_samples equal its test_samples); ``bytes_per_device``: every byte up and down per device,
    all rounds, the closing round and the final broadcast included; ``oracle_*`` / ``*agreement*``:
    the last value of any such server metric: ``oracle_agreement`` (and ``oracle_agreement_<c>``
    per class), the oracle's verdict on the averaged ψ, and ``device_agreement``, the devices' own
    models on their own ψ_k, both from the closing round (every round with ψ every round)."""
    cfg, rounds = run.config, run.rounds
    before = next(
        (r["eval"]["mean_accuracy"] for r in rounds if r["round"] == cfg.rounds and "eval" in r),
        None,
    )
    total = (
        sum(r["bytes_up_total"] + r["bytes_down_total"] for r in rounds)
        + run.summary["finish_bytes_down"]
    )
    out: dict[str, Any] = {"accuracy_before_finetune": before,
                           "bytes_per_device": total / max(len(run.summary["client_accuracy"]), 1)}
    for r in rounds:
        for k, v in (r.get("server") or {}).items():
            if (k.startswith("oracle") or "agreement" in k) and isinstance(v, (int, float)):
                out[k] = v
    if (
        run.cell.method == "fedvtc"
        and run.cell.role == "grid"
        and run.cell.seed == 0
        and run.server is not None
    ):
        out["samples"] = sample_images(run.server)
    return out


SAMPLES_PER_CLASS = 8


def sample_images(server, per_class: int = SAMPLES_PER_CLASS) -> dict[str, Any]:
    """``per_class`` samples ψ(v), v ~ N(c^y, diag σ²), of every known class from the server's
    final ψ, prototypes and σ (a fixed generator seed), each scaled to 0–255 on its own, as
    base64 uint8 [classes, per_class, H, W] (the grid figure is drawn from it at report time)."""
    import numpy as np
    import torch

    from edgefl.algorithms.fedvtc import generate, load_decoder

    if server.psi is None or server.sigma is None:
        return {}
    classes = np.flatnonzero(server.table.known).tolist()
    x, _ = generate(
        load_decoder(server.layout, server.psi),
        torch.from_numpy(server.table.values.astype(np.float32)),
        torch.from_numpy(server.sigma),
        classes,
        per_class,
        torch.Generator().manual_seed(0),
    )
    x = x[:, 0].numpy()  # one channel
    lo, hi = x.min(axis=(1, 2), keepdims=True), x.max(axis=(1, 2), keepdims=True)
    img = np.round(255 * (x - lo) / np.maximum(hi - lo, 1e-8)).astype(np.uint8)
    img = img.reshape(len(classes), per_class, *img.shape[1:])
    return {
        "classes": classes,
        "shape": list(img.shape),
        "uint8_base64": base64.b64encode(img.tobytes()).decode(),
    }


def diagnostics(results: dict) -> str:
    """Per setting and seed, what the claims turn on: FedVTC's accuracy before and after the
    synthetic fine-tune with the oracle's verdict on the averaged ψ it fine-tunes on, ψ every
    round's accuracy and oracle, and the baselines; then how the fine-tune's change follows the
    oracle (Pearson r over the settings' seeds)."""
    import statistics

    runs = results["runs"]
    grid = [r for r in runs if r.get("role") == "grid"]
    by = {(r["setting"], r["method"], r["seed"]): r for r in grid}

    def pct(x):
        return "—" if x is None else f"{100 * x:.1f}"

    def at_round(run, fedvtc_run):
        """``run``'s evaluation after as many rounds as FedVTC trained (FedProto before its 𝒯 extra
        rounds)."""
        rounds = fedvtc_run["resolved_config"]["rounds"]
        return next((p.get("accuracy") for p in run["per_round"] if p["round"] == rounds), None)

    lines = [
        "## What the claims turn on (measured)",
        "",
        "Accuracies in %; **oracle**: the share of the averaged ψ's samples that the central "
        "classifier "
        "assigns to the intended class (chance 10 %); **device**: each device's own model on its "
        "own ψ_k. "
        "FedVTC's fine-tune trains on the averaged ψ's samples, so its change should follow the "
        "oracle. "
        "**fedvtc-tc0** isolates what L_tc does to the model f_k (ψ still learns in its own "
        "step): the notes under "
        "the table compare it with FedProto after the same real-data rounds, and after its "
        "fine-tune; the oracle "
        "decides the default tc_weight (the issue's first criterion), so L_tc's cost to f_k is "
        "measured, not "
        "tuned away.",
        "",
        "| setting | seed | FedVTC before fine-tune | after | change (points) | oracle | device | "
        "ψ every round | its oracle | FedProto at round R | FedProto | FedVTC without L_tc, "
        "before fine-tune | Local |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    changes, oracles = [], []
    for setting in dict.fromkeys(r["setting"] for r in grid):
        for seed in sorted({r["seed"] for r in grid if r["setting"] == setting}):
            v, pr = by.get((setting, "fedvtc", seed)), by.get((setting, "fedvtc-psi-round", seed))
            fp, lo = by.get((setting, "fedproto", seed)), by.get((setting, "local", seed))
            t0 = by.get((setting, "fedvtc-tc0", seed))
            if v is None:
                continue
            before, after = v.get("accuracy_before_finetune"), v["final_accuracy"]
            change = None if before is None else 100 * (after - before)
            if change is not None and v.get("oracle_agreement") is not None:
                changes.append(change)
                oracles.append(v["oracle_agreement"])
            lines.append(
                f"| {setting} | {seed} | {pct(before)} | {pct(after)} | "
                f"{'—' if change is None else f'{change:+.1f}'} | "
                f"{pct(v.get('oracle_agreement'))} | "
                f"{pct(v.get('device_agreement'))} | {pct(pr and pr['final_accuracy'])} | "
                f"{pct(pr and pr.get('oracle_agreement'))} | {pct(fp and at_round(fp, v))} | "
                f"{pct(fp and fp['final_accuracy'])} | "
                f"{pct(t0 and t0.get('accuracy_before_finetune'))} | "
                f"{pct(lo and lo['final_accuracy'])} |"
            )

    def corr(xs, ys):
        return (
            statistics.correlation(xs, ys)
            if len(xs) >= 3 and statistics.pstdev(xs) > 0 and statistics.pstdev(ys) > 0
            else None
        )

    notes = []
    r_all = corr(oracles, changes)
    if r_all is not None:
        per = []
        for setting in dict.fromkeys(r["setting"] for r in grid):
            pairs = [
                (v["oracle_agreement"], 100 * (v["final_accuracy"] - v["accuracy_before_finetune"]))
                for (st, m, _), v in by.items()
                if st == setting
                and m == "fedvtc"
                and v.get("oracle_agreement") is not None
                and v.get("accuracy_before_finetune") is not None
            ]
            rs = corr([a for a, _ in pairs], [b for _, b in pairs])
            if rs is not None:
                per.append(f"{setting}: r = {rs:.2f}")
        notes.append(
            f"The fine-tune's change against the one-shot ψ's oracle, over {len(changes)} runs: "
            "Pearson "
            f"r = {r_all:.2f}" + (f" ({'; '.join(per)})" if per else "") + "."
        )
    pairs = [
        (by[(st, "fedvtc", sd)].get("oracle_agreement"), v.get("oracle_agreement"))
        for (st, m, sd), v in by.items()
        if m == "fedvtc-psi-round" and (st, "fedvtc", sd) in by
    ]
    pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
    if pairs:
        notes.append(
            f"ψ averaged every round is recognised by the oracle more often than the one-shot ψ in "
            f"{sum(b > a for a, b in pairs)} of {len(pairs)} runs (mean "
            f"{100 * statistics.fmean(b for _, b in pairs):.1f} % "
            f"against {100 * statistics.fmean(a for a, _ in pairs):.1f} %)."
        )
    pairs = [(v.get("accuracy_before_finetune"), by[(st, "fedproto", sd)]["final_accuracy"])
             for (st, m, sd), v in by.items() if m == "fedvtc" and (st, "fedproto", sd) in by]
    pairs = [(a, b) for a, b in pairs if a is not None]
    if pairs:
        notes.append(
            "Before its fine-tune, FedVTC is below FedProto's final accuracy (which includes 𝒯 "
            "extra real "
            "full-participation rounds, the paper's baseline budget) in "
            f"{sum(a < b for a, b in pairs)} of "
            f"{len(pairs)} runs."
        )
    # the after-fine-tune comparisons, listed after every setting's before-fine-tune one
    later: list[str] = []
    # FedVTC and fedvtc-tc0 against FedProto
    for setting in dict.fromkeys(r["setting"] for r in grid):
        gaps, tc0, diffs, orc = [], [], [], []
        for seed in sorted({r["seed"] for r in grid if r["setting"] == setting}):
            v, fp, t0 = (by.get((setting, m, seed)) for m in ("fedvtc", "fedproto", "fedvtc-tc0"))
            if not (v and fp):
                continue
            at_r = at_round(fp, v)
            if v.get("accuracy_before_finetune") is not None and at_r is not None:
                gaps.append(100 * (at_r - v["accuracy_before_finetune"]))
                if t0 and t0.get("accuracy_before_finetune") is not None:
                    tc0.append(100 * (at_r - t0["accuracy_before_finetune"]))
            if t0:
                diffs.append(100 * (t0["final_accuracy"] - fp["final_accuracy"]))
                if v.get("oracle_agreement") is not None and t0.get("oracle_agreement") is not None:
                    orc.append((v["oracle_agreement"], t0["oracle_agreement"]))
        if gaps:
            notes.append(
                f"{setting}: after the same R rounds of real data, FedProto is "
                f"{statistics.fmean(gaps):+.1f} points "
                f"(per seed {', '.join(f'{g:+.1f}' for g in gaps)}) over FedVTC before its "
                "fine-tune"
                + (
                    "; over FedVTC without L_tc on f_k (tc_weight 0), "
                    f"{statistics.fmean(tc0):+.1f} "
                    f"({', '.join(f'{g:+.1f}' for g in tc0)})"
                    if len(tc0) == len(gaps)
                    else ""
                )
                + "."
            )
        if diffs:
            later.append(
                f"{setting}: FedVTC without L_tc on f_k, after its fine-tune, against FedProto's "
                "final accuracy: "
                f"{statistics.fmean(diffs):+.2f} points (per seed "
                f"{', '.join(f'{d:+.2f}' for d in diffs)})"
                + (
                    f"; its ψ's oracle {100 * statistics.fmean(b for _, b in orc):.1f} % against "
                    "FedVTC's "
                    f"{100 * statistics.fmean(a for a, _ in orc):.1f} %"
                    if orc
                    else ""
                )
                + "."
            )
    notes += later
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    lines += [""] + below_local(runs)
    return "\n".join(lines)


def figures(results: dict, out: Path) -> str:
    """One sample grid per setting (seed 0's FedVTC run): a row per class, labelled with the
    oracle's share for that class (the closing round's averaged ψ)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    lines = []
    for r in results["runs"]:
        samples = r.get("samples") or {}
        if r["method"] != "fedvtc" or r["role"] != "grid" or "uint8_base64" not in samples:
            continue
        img = np.frombuffer(base64.b64decode(samples["uint8_base64"]), np.uint8).reshape(
            samples["shape"]
        )
        rows, cols = img.shape[:2]
        fig, axes = plt.subplots(rows, cols, figsize=(cols * 0.7 + 1.6, rows * 0.7), squeeze=False)
        for i, c in enumerate(samples["classes"]):
            for j in range(cols):
                axes[i][j].imshow(img[i, j], cmap="gray")
                axes[i][j].set_xticks([])
                axes[i][j].set_yticks([])
            share = r.get(f"oracle_agreement_{c}")
            axes[i][0].set_ylabel(
                f"{c}" + (f": {100 * share:.0f} %" if share is not None else ""),
                rotation=0,
                ha="right",
                va="center",
                fontsize=8,
            )
        fig.suptitle(
            f"FedVTC ψ samples, {r['setting']}, seed {r['seed']} (class: oracle's share)",
            fontsize=9,
        )
        fig.tight_layout()
        name = f"samples_{r['setting']}.png"
        fig.savefig(out / name, dpi=100)
        plt.close(fig)
        lines.append(f"![ψ samples per class, {r['setting']}]({name})")
    if lines:
        lines.insert(
            0,
            f"Synthetic samples ψ(v) per class ({SAMPLES_PER_CLASS} each, seed 0's FedVTC run; "
            "each image "
            "scaled to its own range), row labels: the class and the oracle's share of that "
            "class's samples "
            "it assigns to the class.\n",
        )
    return "\n\n".join(lines)


def profile(quick: bool) -> dict:
    """FedHeNN's five CNNs (tiers 1–5, one device each) at width 0.25 with one common latent of
    p = 980 = 20×7×7, five devices of about 600 images, three of them per round (each device's
    expected 12 real-data epochs over R = 20 rounds, as the earlier fleet of ten devices, half per
    round, over 24), one local epoch at batch 16 per round. Five devices instead of ten halve the
    cost of a run, so five seeds fit the ≤ 1 hour rerun (issue 37; the signs of the claims under
    the reduction: ``reduction.md``)."""
    return benchmark_profile(quick, {
        "model": "cnn",
        "tiers": HETERO,
        "width": 0.25,
        "feature_dim": 980,
        "clients": 5,
        "fraction": 0.6,
        "rounds": 20,
        "train_samples": 3000,
        "optimizer": "sgd",
        "batch_size": 16,
        # test = eval samples: the before-fine-tune evaluation sees the final one's images
        "test_samples": 1000,
        "eval_samples": 1000,
        "eval_every": 4,
    }, {"test_samples": 300, "eval_samples": 300, "eval_every": 2})


def synthetic(quick: bool) -> tuple[int, int]:
    """S synthetic samples and 𝒯 fine-tune epochs (the paper's 500 and 5)."""
    return (100, 1) if quick else (500, 5)


def grid_options(quick: bool) -> dict[str, str]:
    """FedVTC's options in the grid (and in ``tc_sweep``): the method's defaults but S and 𝒯,
    with the oracle metric."""
    S, T = synthetic(quick)
    return {"synthetic_samples": str(S), "finetune_epochs": str(T), "oracle": oracle.PATH}


def local_config(base: dict, quick: bool) -> dict:
    """Local: every device alone for round(fraction·R) + 𝒯 epochs, a FedVTC device's real-data
    epochs plus its fine-tune, with the CNN family's recipe (SGD lr 0.01, momentum 0.9)."""
    epochs = round(base["fraction"] * base["rounds"]) + synthetic(quick)[1]
    return {"algorithm": "local", "fraction": 1.0, "rounds": epochs,
            "eval_every": max(1, epochs // 8), **BASELINE}


def make(quick: bool = False) -> Benchmark:
    base = profile(quick)
    settings = {"dir1": SETTINGS["dir1"]} if quick else SETTINGS
    seeds = SEEDS[:2] if quick else SEEDS
    R = base["rounds"]
    # synthetic samples, fine-tune epochs (the paper's S and 𝒯)
    S, T = (100, 1) if quick else (500, 5)
    # finetune_lr none: the fine-tune at the run's lr, the method's default when these cells ran
    # (since issue 17's quick-command sweep the default is 0.001, chosen for 3 rounds, not measured
    # at this budget); explicit, so the committed cells keep their keys and say what they ran
    vtc = {
        "synthetic_samples": str(S),
        "finetune_epochs": str(T),
        "finetune_lr": "none",
        "oracle": oracle.PATH,
    }
    # the grid and bounds run the method's defaults (finetune_lr 0.001) with the lr ×0.1 at 40 % and
    # 70 % of each run's rounds, so the last quarter, where convergence is read, comes after both;
    # the sweeps above ran without a decay and at the fine-tune's earlier lr, and keep their keys
    grid_vtc = {k: v for k, v in vtc.items() if k != "finetune_lr"}
    baseline = {"lr": 0.01, "momentum": 0.9}
    # a FedVTC device's real-data epochs plus its fine-tune
    local_epochs = round(base["fraction"] * R) + T

    def config(method):
        if method == "fedvtc":
            return {"algorithm": "fedvtc", "options": grid_vtc}
        if method == "fedvtc-le":
            return {"algorithm": "fedvtc", "options": {**grid_vtc, "lam": "0"}}
        if method == "fedvtc-psi-round":
            return {"algorithm": "fedvtc", "options": {**grid_vtc, "psi_every_round": "true"}}
        # the diagnostic: f_k trains without L_tc (ψ still learns in its own step)
        if method == "fedvtc-tc0":
            return {"algorithm": "fedvtc", "options": {**grid_vtc, "tc_weight": "0"}}
        if method == "fedproto":  # the paper gives its baselines 𝒯 extra full-participation rounds
            return {
                "algorithm": "fedproto",
                "rounds": R + T,
                "options": {"full_last_rounds": str(T)},
                **baseline,
            }
        if method == "local":
            return {"algorithm": "local", "fraction": 1.0, "rounds": local_epochs,
                    "eval_every": max(1, local_epochs // 8), **baseline}
        raise ValueError(method)

    def cell(method, setting, seed, role="grid", extra=None, name=None):
        config_ = {**base, **SETTINGS[setting], **config(method), **(extra or {})}
        return Cell(
            method,
            name or setting,
            seed,
            {**config_, "lr_decay_rounds": decay_rounds(config_["rounds"])},
            role,
        )

    cells = [cell(m, s, seed) for s in settings for seed in seeds for m in METHODS]
    centralized = [
        cell(
            "local",
            "dir1",
            0,
            role="bound",
            name="centralized",
            extra={"clients": 1, "partition": "iid", "tiers": (t,)},
        )
        for t in (HETERO[:1] if quick else HETERO)
    ]
    local_iid = [
        cell("local", "dir1", seed, role="bound", name="local-iid", extra={"partition": "iid"})
        for seed in seeds
    ]
    validation = {"validation_samples": 200 if quick else 1000}
    # The first sweep: tc_weight × lr (SGD momentum 0; Adam). Its cells ran before the decoder
    # options existed and keep their keys (benchmarks/runner.py: ADDED_OPTIONS).
    variants = (
        [(w, lr, "sgd") for w in TC_WEIGHTS for lr in LRS]
        + [(w, lr, "sgd") for w, lr in EXTENDED]
        + ADAM
    )
    first = [
        f"tc_weight={w}, lr={lr}" + (f", {opt}" if opt != "sgd" else "") for w, lr, opt in variants
    ]
    first_cells = {
        g: [
            Cell(
                "fedvtc",
                f"sweep-{s}",
                0,
                {
                    **base,
                    **SETTINGS[s],
                    "algorithm": "fedvtc",
                    "optimizer": opt,
                    "lr": lr,
                    "momentum": 0.0,
                    "options": {**vtc, "tc_weight": str(w), **PAPER_DECODER},
                    **validation,
                },
                "sweep",
            )
            for s in settings
        ]
        for g, (w, lr, opt) in zip(first, variants, strict=True)
    }
    # The second sweep: the decoder options, at the first sweep's best-training setting.
    decoder = DECODER[-2:] if quick else DECODER
    grid = [f"proto_rc_weight={w:g}, psi_bn={bn}" for w, bn in decoder]
    chosen = "proto_rc_weight=10, psi_bn=recalibrate"  # the method's defaults
    decoder_cells = {
        g: [
            Cell(
                "fedvtc",
                f"sweep-{s}",
                0,
                {
                    **base,
                    **SETTINGS[s],
                    "algorithm": "fedvtc",
                    **DECODER_BASE,
                    "options": {
                        **vtc,
                        "tc_weight": "0.001",
                        "proto_rc_weight": str(w),
                        "psi_bn": bn,
                    },
                    **validation,
                },
                "sweep",
            )
            for s in settings
        ]
        for g, (w, bn) in zip(grid, decoder, strict=True)
    }
    sweeps = (
        []
        if quick
        else [  # the smoke profile checks the decoder sweep end to end
            Sweep(
                "fedvtc tc_weight × lr (SGD momentum 0; Adam)",
                first,
                first_cells,
                metric="oracle_agreement",
                note="first criterion: the oracle metric (share of ψ's samples the oracle assigns "
                "to the intended class)",
            ),
            Sweep(
                "fedvtc tc_weight × lr (SGD momentum 0; Adam)",
                first,
                first_cells,
                metric="final_accuracy",
                note="second criterion: validation accuracy; seed 0 in each setting",
            ),
        ]
    )
    sweeps += [
        Sweep(
            "fedvtc decoder: proto_rc_weight × psi_bn (SGD 0.1, tc_weight 0.001)",
            grid,
            decoder_cells,
            metric="oracle_agreement",
            note="first criterion: the oracle metric on the averaged ψ",
            default=chosen,
        ),
        Sweep(
            "fedvtc decoder: proto_rc_weight × psi_bn (SGD 0.1, tc_weight 0.001)",
            grid,
            decoder_cells,
            metric="final_accuracy - accuracy_before_finetune",
            note="what the synthetic fine-tune adds (validation accuracy after − before)",
        ),
        Sweep(
            "fedvtc decoder: proto_rc_weight × psi_bn (SGD 0.1, tc_weight 0.001)",
            grid,
            decoder_cells,
            metric="final_accuracy",
            note="validation accuracy after the fine-tune; seed 0 in each setting",
        ),
    ]
    claims = []
    # the paper's numbers: MNIST (Table 1, Dir 0.1 / Dir 1.0), the nearest to Fashion-MNIST
    for s in settings:
        i = 0 if s == "dir0.1" else 1
        claims += [
            Claim(
                f"fedvtc-gt-fedproto-{s}",
                "fedvtc > fedproto",
                s,
                paper=(
                    "+3.2 (88.7 vs 85.5, CCVR the best baseline)",
                    "+3.3 (90.1 vs 86.8, FedTGP the best baseline)",
                )[i]
                + "; FedProto below the best baseline",
            ),
            Claim(
                f"finetune-raises-{s}",
                "fedvtc > fedvtc",
                s,
                metric_a="final_accuracy",
                metric_b="accuracy_before_finetune",
                note="after vs before the synthetic fine-tune, same devices",
                paper="abstract: the fine-tune 'significantly' increases generalization (no "
                "number)",
            ),
            Claim(
                f"ldm-helps-{s}",
                "fedvtc > fedvtc-le",
                s,
                note="L_e + λ·L_dm against L_e only",
                paper=("+1.5 (88.7 vs 87.2, ablation)", "+0.2 (90.1 vs 89.9, ablation)")[i],
            ),
            Claim(
                f"oneshot-fewer-bytes-{s}",
                "fedvtc < fedvtc-psi-round",
                s,
                metric="bytes_per_device",
                kind="construction",
                note="one ψ upload against one per round: true by construction",
                paper="0.70 vs 5.63 GB (MNIST)",
            ),
            Claim(
                f"oneshot-accuracy-{s}",
                "fedvtc ≥ fedvtc-psi-round",
                s,
                kind="not worse",
                note="the paper's own per-round ψ is better by the paper's numbers",
                paper=("−1.0 (88.7 vs 89.7)", "−2.2 (90.1 vs 92.3)")[i],
            ),
            Claim(f"ldm-not-worse-{s}", "fedvtc ≥ fedvtc-le", s, kind="not worse"),
        ]
        # every method against Local: what federating adds over a device alone
        claims += [Claim(f"{m}-gt-local-{s}", f"{m} > local", s, kind="implied",
                         note=LOCAL_NOTE if (m, s) == ("fedvtc", "dir1") else "")
                   for m in ("fedvtc", "fedvtc-le", "fedvtc-psi-round", "fedproto")]
    fleet = fleet_text(base, quick, groups=("tier", 5), rounds_name="R",
                       quick_note=", Dir(1) only, S = 100, 𝒯 = 1", note=", S = 500, 𝒯 = 5")
    return Benchmark(
        name="fedvtc",
        title="FedVTC vs FedProto and Local on Fashion-MNIST",
        description=f"""
Fleet: FedHeNN's five CNNs (tiers 1–5) at **width 0.25**, one common latent p = 980; {fleet}; half
the devices per round, one local epoch at batch 16, the lr ×0.1 at 40 % and 70 % of each run's \
rounds
(at rounds {decay_rounds(R)[0] + 1} and {decay_rounds(R)[1] + 1} of FedVTC's R; the sweeps ran \
without it). FedVTC (and its ablations) run at the method's
defaults: initial prototypes from each device's local class means and σ from the spread of its
features around them (the errata); tc_weight × lr at momentum 0 is the first sweep below; the
decoder options (`proto_rc_weight` 10: each ψ_k also decodes the global prototypes into its class
images; `psi_bn` recalibrate: the server re-estimates the averaged ψ's BatchNorm statistics; both
departures from the paper, whose ψ average decoded one image for every class) are the second,
chosen by the oracle metric first, then by what the fine-tune adds, then by validation accuracy; the
synthetic fine-tune runs at the method's default `finetune_lr` 0.001 (chosen for the 3-round quick
command in `quick_defaults.md`; the sweeps ran it at the run's lr); FedProto and Local train with \
SGD lr 0.01,
momentum 0.9. Methods: **fedvtc** (R rounds, the one-shot ψ upload, then S synthetic samples and 𝒯
fine-tune epochs per device), **fedvtc-le** (λ = 0: L_e only), **fedvtc-psi-round** (ψ every \
round), **fedvtc-tc0** (the diagnostic below: tc_weight 0, f_k trains without L_tc while ψ still \
learns in its own step),
**fedproto** (R rounds + 𝒯 extra rounds with every device, the paper's baseline budget), **local**
(every device alone for round(fraction·R) + 𝒯 epochs: a FedVTC device's real-data epochs plus its
fine-tune). Settings Dir(0.1) and Dir(1); seeds {list(seeds)}. Accuracy: mean over devices on
{base["test_samples"]} test images; `accuracy_before_finetune` is the evaluation after round R on \
the
same images (for every method with a fine-tune, ψ every round included: the round loop keeps the \
last
training round's evaluation when the method's finish trains; before it did not for ψ every round, \
whose
curves then ended on the after-fine-tune accuracy and read as still climbing, slopes 2.2–4.5). \
Bytes: everything up and down per device over the whole run. **Oracle metric**: the
share of the averaged ψ's samples (50 per class, from the global prototypes and σ) that a
classifier trained centrally on all 60,000 training images and kept out of the federation
(`oracle.safetensors`, FedHeNN's CNN tier 5 at width 0.5, 3 epochs; its test accuracy is in
`oracle.json`) assigns to the intended class; **device agreement**: the same share under each
device's own model for its own ψ_k, in the closing round.
""",
        cells=cells,
        claims=claims,
        sweeps=sweeps,
        bounds={"centralized": centralized, "local_iid": local_iid},
        record_extras="benchmarks.fedvtc:extras",
        prepare=lambda: oracle.ensure(ROOT),
        figures=figures,
        diagnostics=diagnostics,
        command="python -m benchmarks.fedvtc" + (" --quick" if quick else ""),
        paper="FedVTC (Niu, Dong & Qin, variational transposed convolution)",
    )
