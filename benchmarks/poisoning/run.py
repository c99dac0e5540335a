"""Poisoning: 20% of devices send well-formed but malicious updates; accuracy with and without
the defences of ``edgefl.algorithms.aggregate`` (issue 19).

Fleet: 10 devices on a subsample of Fashion-MNIST (IID, every device every round); devices d00
and d01 (2 of 10 = 20%) attack. Accuracy is the mean over the 8 honest devices of their final
evaluation on the test subsample (FedAvg: the global model; FedProto: each device's own model).

Attacks, applied by an attacker to its uplink after its honest local work; ``ref`` is what the
device received this round for that tensor or class (FedAvg: the global weights; FedProto: the
global prototype of that class, once the server has one), else 0:

- ``scale``       every float array: ref + 10·(x − ref)
- ``signflip``    every float array: ref − 4·(x − ref)
- ``scale_x100``  every float array: ref + 100·(x − ref) (FedProto: scaled prototypes)
- ``wrong_class`` (FedProto) the prototype of class y is replaced by ref_y + 5·(x_{y+1} − ref_y),
                  x_{y+1} the attacker's own prototype of class y+1 (mod C): with 2 of 10 devices
                  sending it, the mean lands on class y+1's prototype, so every honest device is
                  pulled to map class y where class y+1 lies.

Every attacked uplink passes every wire check: finite float32 of the declared shapes.

Defences (method options): ``none`` (the method's mean), ``median`` (coordinate-wise),
``trimmed_mean`` (trim 0.2: the 2 largest and 2 smallest of 10 values per coordinate dropped),
``clip`` (``clip_norm``: FedAvg bounds each device's weight update, FedProto each class
prototype's distance from the global one). The clip bound is calibrated on the clean cells: the
median of what honest devices sent there (the same quantity the server bounds), so it needs the
clean cells first; it is recorded in results.json.

Per cell the benchmark also records, over the honest devices' local training, the mean
cross-entropy and the mean of the method's knowledge term (FedProto: λ·MSE to the global
prototypes) — how much the payload steers training — and for FedProto the distance of the
global prototypes from the honest devices' class means.

A cell whose training broke down (every device's local loss non-finite, so the round loop
stops) is counted as "diverged": the attack won outright.

The attack is attached by wrapping the method's device half in this process (a simulated fleet);
over MQTT the same payloads would arrive from a device's own process.

    nice -n 10 python -m benchmarks.poisoning.run            # all cells, 3 seeds
    python -m benchmarks.poisoning.run --quick              # one seed, 2 rounds (smoke test)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.common import machine, write_json  # noqa: E402
from benchmarks.timing import command_line
from edgefl.algorithms import fedproto as fedproto_mod  # noqa: E402
from edgefl.algorithms import get_algorithm  # noqa: E402
from edgefl.config import resolve_config  # noqa: E402
from edgefl.errors import EdgeflError  # noqa: E402
from edgefl.report import recorder  # noqa: E402
from edgefl.runtime import simulation  # noqa: E402

# skip the per-run plots (the machine is shared)
simulation.finish_run = lambda rec, summary, plots=True: recorder.finish_run(
    rec, summary, plots=False
)

HERE = Path(__file__).parent
CLIENTS = 10
ATTACKERS = ("d00", "d01")
FACTORS = {"scale": 10.0, "signflip": -4.0, "scale_x100": 100.0}
PULL = CLIENTS / len(ATTACKERS)  # wrong_class: how far the attackers push so that the mean lands
#: the attacks run per method (all of FACTORS and wrong_class are implemented for every method
#: listed; one each fits the shared machine's CPU: pass --attacks to run others)
ATTACKS = {"fedavg": ("scale",), "fedhe": ("wrong_class",), "fedproto": ("wrong_class", "scale")}
#: per method: data, rounds and local epochs, and the settings that differ from its defaults
#: (the knowledge methods on one CNN tier: the cell is about aggregation)
CNN = {"model": "cnn", "tiers": ("2",), "width": 0.5, "model_options": {}}
SETTINGS = {
    "fedavg": {"train_samples": 10000, "rounds": 6, "epochs": 1},
    "fedhe": {"train_samples": 6000, "rounds": 5, "epochs": 1, **CNN},
    "fedproto": {"train_samples": 6000, "rounds": 5, "epochs": 1, **CNN},
}
#: FedProto's cells show why prototypes barely steer training (see the CE / knowledge-term column);
#: its defences are tested in tests/test_defences.py, here only the median is run
METHOD_DEFENCES = {"fedproto": ("none", "median")}
DEFENCES = {
    "none": {},
    "median": {"aggregator": "median"},
    "trimmed_mean": {"aggregator": "trimmed_mean", "trim": 0.2},
    "clip": {"clip_norm": None},  # calibrated on the clean cells
}


class Probe:
    """What one cell's honest devices sent and how their training went."""

    def __init__(self):
        # per uplink (FedAvg) or per class prototype (FedProto): distance from ref
        self.sent: list[float] = []
        self.ce: list[float] = []
        self.term: list[float] = []  # the knowledge term of the loss (λ·MSE)
        # per round: mean distance of the global prototypes from honest class means
        self.proto_error: list[float] = []


def _dist(a: np.ndarray, ref: np.ndarray | None) -> float:
    a = np.asarray(a, np.float64)
    return float(np.linalg.norm(a if ref is None else a - np.asarray(ref, np.float64)))


def _attack_weights(arrays: dict, received: dict, attack: str) -> None:
    factor = FACTORS[attack]
    for name, a in list(arrays.items()):
        if a.dtype.kind != "f":
            continue
        ref = received.get(name)
        ref = np.zeros_like(a) if ref is None or ref.shape != a.shape else ref.astype(a.dtype)
        arrays[name] = (ref + factor * (a - ref)).astype(a.dtype)


def _attack_logits(arrays: dict, received: dict, attack: str) -> None:
    """FedHe: per class y, the logit row (and feature row, where sent) of class y+1 (wrong_class)
    or the sign-flipped row, around what the server sent for y."""
    for name in ("logit", "feat"):
        if name not in arrays:
            continue
        own = np.asarray(arrays[name], np.float64)
        ref = np.asarray(received[name], np.float64) if name in received else np.zeros_like(own)
        if attack == "wrong_class":
            arrays[name] = (ref + PULL * (np.roll(own, -1, axis=0) - ref)).astype(np.float32)
        else:
            arrays[name] = (ref + FACTORS[attack] * (own - ref)).astype(np.float32)


def _received_protos(received: dict) -> dict[int, np.ndarray]:
    if fedproto_mod.PROTO not in received:
        return {}
    return {
        int(c): received[fedproto_mod.PROTO][i]
        for i, c in enumerate(received[fedproto_mod.PROTO_CLASSES])
    }


def _attack_protos(arrays: dict, received: dict, attack: str, num_classes: int) -> None:
    classes = [int(c) for c in arrays[fedproto_mod.PROTO_CLASSES]]
    own = dict(zip(classes, np.asarray(arrays[fedproto_mod.PROTO], np.float64), strict=True))
    refs = _received_protos(received)
    out = []
    for c in classes:
        ref = np.asarray(refs.get(c, np.zeros_like(own[c])), np.float64)
        if attack == "wrong_class":
            target = own.get((c + 1) % num_classes, own[c])
            out.append(ref + PULL * (target - ref))
        else:
            out.append(ref + FACTORS[attack] * (own[c] - ref))
    arrays[fedproto_mod.PROTO] = np.stack(out).astype(np.float32)


def install_attack(method: str, attack: str | None, probe: Probe):
    """Wrap the method's device (and, for FedProto, server) half: attackers rewrite their uplink,
    honest devices' traffic and loss terms are measured. Returns an undo function."""
    algo = get_algorithm(method)
    cls, server_cls = algo.device, algo.server
    receive, fit = cls.receive, cls.fit
    loss = getattr(cls, "loss", None)
    aggregate = server_cls.aggregate

    def attacked_receive(self, round, payload):
        self._received = {k: np.array(v) for k, v in payload.arrays.items()}
        return receive(self, round, payload)

    def attacked_fit(self, round):
        up = fit(self, round)
        received = getattr(self, "_received", {})
        if self.ctx.device_id not in ATTACKERS:
            if method == "fedhe":
                for name in ("logit",):
                    ref = received.get(name)
                    for c in np.flatnonzero(up.arrays["count"] > 0):
                        probe.sent.append(
                            _dist(
                                up.arrays[name][c],
                                None if ref is None or not received["known"][c] else ref[c],
                            )
                        )
            elif method == "fedproto":
                refs = _received_protos(received)
                for i, c in enumerate(up.arrays[fedproto_mod.PROTO_CLASSES]):
                    probe.sent.append(_dist(up.arrays[fedproto_mod.PROTO][i], refs.get(int(c))))
            else:
                probe.sent.append(
                    _dist(
                        np.concatenate(
                            [np.ravel(a) for k, a in up.arrays.items() if a.dtype.kind == "f"]
                        ),
                        np.concatenate(
                            [
                                np.ravel(received[k])
                                for k, a in up.arrays.items()
                                if a.dtype.kind == "f"
                            ]
                        )
                        if received
                        else None,
                    )
                )
            return up
        if attack is None:
            return up
        if method == "fedproto":
            _attack_protos(up.arrays, received, attack, self.ctx.num_classes)
        elif method == "fedhe":
            _attack_logits(up.arrays, received, attack)
        else:
            _attack_weights(up.arrays, received, attack)
        return up

    def probed_loss(self, x, y):
        z = self.model.features(x)
        ce = torch.nn.functional.cross_entropy(self.model.classify(z), y)
        term = self.options.lam * fedproto_mod.prototype_loss(z, y, self.protos, self.known)
        if self.ctx.device_id not in ATTACKERS:
            probe.ce.append(float(ce.detach()))
            probe.term.append(float(term.detach()))
        return ce + term

    def probed_aggregate(self, round, uplinks):
        honest = [
            fedproto_mod.unpack_prototypes(p.arrays, self.ctx.num_classes, self.dim)
            for d, p in uplinks.items()
            if d not in ATTACKERS
        ]
        out = aggregate(self, round, uplinks)
        errors = []
        for c in range(self.ctx.num_classes):
            vs = [h[c] for h in honest if c in h]
            if vs and self.table.known[c]:
                errors.append(_dist(self.table.values[c], np.mean(vs, axis=0)))
        if errors:
            probe.proto_error.append(float(np.mean(errors)))
        return out

    loss_terms = getattr(cls, "loss_terms", None)

    def probed_loss_terms(self, x, y, round):
        terms = loss_terms(self, x, y, round)
        if self.ctx.device_id not in ATTACKERS:
            probe.ce.append(float(terms.ce.detach()))
            probe.term.append(float(self.options.alpha * (terms.mse + terms.kl).detach()))
        return terms

    cls.receive, cls.fit = attacked_receive, attacked_fit
    if method == "fedproto":
        cls.loss, server_cls.aggregate = probed_loss, probed_aggregate
    if method == "fedhe":
        cls.loss_terms = probed_loss_terms

    def undo():
        cls.receive, cls.fit = receive, fit
        if method == "fedproto":
            cls.loss, server_cls.aggregate = loss, aggregate
        if method == "fedhe":
            cls.loss_terms = loss_terms

    return undo


def run_cell(
    method: str, attack: str | None, defence: str, seed: int, args, clip: float | None
) -> dict:
    settings = {**SETTINGS[method], **({"rounds": 2} if args.quick else {})}
    options = dict(DEFENCES[defence])
    if defence == "clip":
        options["clip_norm"] = clip
    explicit = {
        "algorithm": method,
        "dataset": "fashion-mnist",
        "data_dir": args.data_dir,
        "clients": CLIENTS,
        "epochs": settings["epochs"],
        "rounds": settings["rounds"],
        "partition": "iid",
        "fraction": 1.0,  # every device every round: the attackers always take part
        "train_samples": settings["train_samples"],
        "test_samples": args.test,
        "eval_samples": 500,
        "eval_every": settings["rounds"],  # only the final evaluation counts here
        "seed": seed,
        "threads": 1,
        "options": {k: str(v) for k, v in options.items()},
        "run_name": f"{method}-{attack}-{defence}-{seed}",
        **{k: v for k, v in settings.items() if k not in ("train_samples", "rounds", "epochs")},
    }
    algo = get_algorithm(method)
    probe = Probe()
    undo = install_attack(method, attack, probe)
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    cell = {
        "method": method,
        "attack": attack or "none",
        "defence": defence,
        "seed": seed,
        "options": options,
        "settings": {k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()},
    }
    try:
        with tempfile.TemporaryDirectory() as out:
            cfg = resolve_config({**explicit, "out_dir": out}, dict(algo.defaults))
            summary = simulation.simulate(cfg, plots=False)
    except EdgeflError as e:  # the attack broke training: every device's loss went non-finite
        return {
            **cell,
            "honest_accuracy": None,
            "diverged": str(e)[:200],
            "seconds": time.perf_counter() - t0,
        }
    finally:
        undo()
    honest = [a for d, a in summary["client_accuracy"].items() if d not in ATTACKERS]
    probes = {"honest_sent": probe.sent}
    if probe.ce:
        probes.update(
            {
                "honest_ce": statistics.mean(probe.ce),
                "honest_knowledge_term": statistics.mean(probe.term),
            }
        )
    if probe.proto_error:
        probes["prototype_error_last_round"] = probe.proto_error[-1]
    return {
        **cell,
        "honest_accuracy": statistics.mean(honest),
        "mean_accuracy": summary["mean_accuracy"],
        "seconds": time.perf_counter() - t0,
        "cpu_seconds": time.process_time() - cpu0,
        **probes,
    }


def calibrate(results: list[dict], method: str) -> float | None:
    """The clip bound: the median of what honest devices sent in the clean cells."""
    sent = [
        x
        for r in results
        if r["method"] == method and r["attack"] == "none" and r["defence"] == "none"
        for x in r.get("honest_sent", [])
    ]
    return float(np.median(sent)) if sent else None


def table(results: list[dict]) -> list[str]:
    cells: dict[tuple, list[dict]] = {}
    for r in results:
        cells.setdefault((r["method"], r["attack"], r["defence"]), []).append(r)
    order = {d: i for i, d in enumerate(DEFENCES)}
    lines = [
        "| method | attack | defence | honest devices' accuracy, % (mean ± sd) | per seed | "
        "diverged | CE / knowledge term |",
        "|---|---|---|---|---|---|---|",
    ]
    for (m, a, d), rs in sorted(
        cells.items(), key=lambda kv: (kv[0][0], kv[0][1] != "none", kv[0][1], order[kv[0][2]])
    ):
        rs = sorted(rs, key=lambda r: r["seed"])
        done = [r["honest_accuracy"] for r in rs if r["honest_accuracy"] is not None]
        sd = statistics.stdev(done) if len(done) > 1 else 0.0
        acc = (
            f"{100 * statistics.mean(done):.1f} ± {100 * sd:.1f}" if done else "— (no run finished)"
        )
        per_seed = ", ".join(
            "div." if r["honest_accuracy"] is None else f"{100 * r['honest_accuracy']:.1f}"
            for r in rs
        )
        terms = [(r["honest_ce"], r["honest_knowledge_term"]) for r in rs if "honest_ce" in r]
        term = (
            f"{statistics.mean(t[0] for t in terms):.3f} / "
            f"{statistics.mean(t[1] for t in terms):.4f}"
            if terms
            else ""
        )
        lines.append(f"| {m} | {a} | {d} | {acc} | {per_seed} | {len(rs) - len(done)} | {term} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument(
        "--attacks",
        default="",
        help="override the attacks, e.g. fedavg=scale+signflip;fedhe=signflip",
    )
    ap.add_argument(
        "--defences",
        default="",
        help="only these defences (e.g. trimmed_mean,clip: to split the cells over processes)",
    )
    ap.add_argument(
        "--seed-list",
        default="",
        help="only these seeds (e.g. 0,1: to split the cells over processes)",
    )
    ap.add_argument("--test", type=int, default=2000, help="test images")
    ap.add_argument("--methods", default="fedavg,fedhe,fedproto")
    ap.add_argument(
        "--no-cost", action="store_true", help="skip the defences' cost without an attack"
    )
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument(
        "--quick", action="store_true", help="one seed, 2 rounds, into --out (a smoke test)"
    )
    ap.add_argument(
        "--report", action="store_true", help="only rewrite results.json/md from the cell files"
    )
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.quick:
        args.seeds = 1
    cells_dir = args.out / "cells"
    command = command_line("benchmarks.poisoning.run", argv)
    if args.report:
        write_results(args, command)
        return
    methods = args.methods.split(",")
    attacks = dict(ATTACKS)
    for item in filter(None, args.attacks.split(";")):
        m, _, names = item.partition("=")
        attacks[m] = tuple(names.split("+"))
    only = set(args.defences.split(",")) if args.defences else set(DEFENCES)
    # clean cells first (they calibrate the clip bound), then attacks without and with each
    # defence, then the defences' cost without an attack
    order = [(m, None, "none") for m in methods]
    order += [
        (m, a, d) for m in methods for a in attacks[m] for d in METHOD_DEFENCES.get(m, DEFENCES)
    ]
    if not args.no_cost:
        order += [
            (m, None, d) for m in methods for d in METHOD_DEFENCES.get(m, DEFENCES) if d != "none"
        ]
    order = [c for c in order if c[2] in only]
    seeds = [int(x) for x in args.seed_list.split(",")] if args.seed_list else range(args.seeds)
    for method, attack, defence in order:
        for seed in seeds:
            path = cells_dir / f"{method}-{attack or 'none'}-{defence}-{seed}.json"
            settings = {**SETTINGS[method], **({"rounds": 2} if args.quick else {})}
            if path.exists() and json.loads(path.read_text()).get("settings") == json.loads(
                json.dumps(settings)
            ):
                continue  # resume: a finished cell of the same settings is kept
            clip = calibrate(_cells(cells_dir), method) if defence == "clip" else None
            if defence == "clip" and clip is None:
                print(f"skip {path.name}: no clean cell to calibrate the clip bound", flush=True)
                continue
            r = run_cell(method, attack, defence, seed, args, clip)
            r["command"] = command
            r["load_after"] = [round(x, 2) for x in os.getloadavg()]
            write_json(path, r)
            print(json.dumps({k: v for k, v in r.items() if k != "honest_sent"}), flush=True)
            write_results(args, command)
    print("done", flush=True)


def _cells(cells_dir: Path) -> list[dict]:
    return [json.loads(f.read_text()) for f in sorted(cells_dir.glob("*.json"))]


def write_results(args, command: str) -> None:
    results = _cells(args.out / "cells")
    clips = {m: calibrate(results, m) for m in {r["method"] for r in results}}
    commands = sorted({r.get("command", "") for r in results})
    write_json(
        args.out / "results.json",
        {
            "commands": commands,
            "machine": machine(),
            "settings": SETTINGS,
            "attackers": list(ATTACKERS),
            "factors": FACTORS,
            "wrong_class_pull": PULL,
            "clip_norm": clips,
            "results": results,
        },
    )
    loads = [r["load_after"][0] for r in results if "load_after" in r]
    cpu = sum(r.get("cpu_seconds", 0.0) for r in results)
    md = [
        f"# Poisoning: {len(ATTACKERS)} of {CLIENTS} devices send malicious updates",
        "",
        "Command(s): "
        + ", ".join(f"`{c}`" for c in commands)
        + " (the cells are files under cells/; processes may run side by side)  ",
        f"Fashion-MNIST IID over {CLIENTS} devices, every device every round, test on {args.test} "
        "images; "
        f"attackers {', '.join(ATTACKERS)} ({100 * len(ATTACKERS) // CLIENTS}%); accuracy is the "
        "mean over the "
        f"{CLIENTS - len(ATTACKERS)} honest devices (FedAvg: the global model; FedHe and "
        "FedProto: each device's own model).  ",
        "Per method: "
        + "; ".join(
            f"{m}: {v['train_samples']} training images, {v['rounds']} rounds × {v['epochs']} "
            "local epoch"
            + (f", CNN tier {v['tiers'][0]} width {v['width']}" if "tiers" in v else "")
            for m, v in SETTINGS.items()
        )
        + ".  ",
        f"Attacks: `scale` ×{FACTORS['scale']:g} and `signflip` ×{FACTORS['signflip']:g} of the "
        "update from what the device received; "
        "`wrong_class`: class y's knowledge (FedHe: logit row; FedProto: prototype) moved "
        f"×{PULL:g} towards the attacker's own of class y+1.  ",
        "Clip bounds (median of what honest devices sent in the clean cells — FedAvg: the weight "
        "update's L2 norm; FedHe: "
        "a class logit row's distance from the server's; FedProto: a class prototype's): "
        + ", ".join(f"{m} {c:.3f}" if c is not None else f"{m} —" for m, c in sorted(clips.items()))
        + "  ",
        f"Total CPU {cpu / 60:.1f} min over {len(results)} cells; 1-min load after each cell "
        + (f"{min(loads):.1f}–{max(loads):.1f}" if loads else "—")
        + f".  \nMachine at the last write: {json.dumps(machine())}",
        "",
        *table(results),
        "",
        "CE / knowledge term: the honest devices' mean cross-entropy and mean knowledge term of "
        "their loss (FedHe: α·KL to the "
        "class logits; FedProto: λ·MSE to the global prototypes) over every local step of the "
        "cell.",
        "",
        "Why a wrong-class payload barely moves a knowledge method's accuracy here: both methods "
        "add the payload's term to "
        "the device's own cross-entropy on its own labels. FedHe: per sample, CE(p, y) + "
        "α·KL(q‖p) is smallest at "
        "p = (e_y + α·q)/(1 + α), whose largest entry is still y for any target q when α < 1 (the "
        "default α is 0.5): "
        "a poisoned class target can soften a device's predictions but not turn them on the "
        "samples it trains on. "
        "FedProto: λ·MSE pulls features towards the class prototypes while the head is trained by "
        "CE alone; a "
        "prototype table whose classes are permuted (wrong_class) is still a set of distinct "
        "targets, and the head "
        "learns where each class now lies. What can harm FedProto is magnitude: scaled prototypes "
        "make the MSE term "
        "dominate (the knowledge-term column of the scale_x100 cells, where run).",
    ]
    (args.out / "results.md").write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
