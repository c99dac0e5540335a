"""Why a Felo device collapses at ε = 1 (issue 37): the sanity gate lists a device of the grid's
``felo ε=1`` run that predicts one class while it holds several. This reruns that cell (its
configuration and seed, from the benchmark's grid) and records what the collapsed devices are
sent: the global per-class logits Felo's server returns each round (the same for every device),
whose arg-max should be the class itself. Under local DP each device's per-class sums and counts
carry noise before the uplink; if the noise turns a class's global logits towards another class,
a device distills its images of that class towards the wrong one.

    nice -n 5 python -m benchmarks.privacy.felo_collapse     # writes felo_collapse.json here

It reads the grid's cached cell for the collapsed devices (the gate's rule), so the grid has run;
the rerun's collapse is checked against the cell's (the same devices, the same accuracy).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROUNDS_SHOWN = 4


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epsilon", default="1")
    p.add_argument("--seed", type=int, default=2)
    args = p.parse_args(argv)

    import torch

    from benchmarks import gates, provenance
    from benchmarks.cache import Cache
    from benchmarks.privacy import make
    from edgefl.algorithms import get_algorithm
    from edgefl.algorithms.felo import device as felo_device
    from edgefl.config import resolve_config
    from edgefl.report.recorder import read_rounds
    from edgefl.runtime.simulation import simulate

    torch.set_num_threads(1)
    cell = next(c for c in make(False).cells
                if c.method == f"felo ε={args.epsilon}" and c.seed == args.seed)
    record = Cache(HERE / "cells").find(cell)
    if record is None:
        raise SystemExit(f"{cell.label}: not in the grid's cache; run the benchmark first")
    collapsed = gates.collapsed_devices(record)[0]
    if not collapsed:  # the grid's Felo cells clip each local step's gradient since f7b12ab
        raise SystemExit(f"{cell.label}: no device predicts one class (the grid's Felo recipe "
                         "clips the local gradient, felo_recipe.md); felo_collapse.json keeps "
                         "the diagnosis of the run before the clip")
    sent: dict[int, np.ndarray] = {}
    known: dict[int, list[bool]] = {}  # the classes the server has statistics of (the rest: zeros)
    receive = felo_device.FedHeDevice.receive

    def recording(self, round: int, payload) -> None:  # the device's own receive, then a copy
        receive(self, round, payload)
        if round not in sent and getattr(self, "server_logit", None) is not None:
            sent[round] = self.server_logit.cpu().numpy().copy()
            known[round] = self.known.cpu().numpy().astype(bool).tolist()

    felo_device.FedHeDevice.receive = recording
    with tempfile.TemporaryDirectory() as tmp:
        explicit = {**cell.full_config(), "out_dir": tmp, "run_name": "run", "threads": 1}
        cfg = resolve_config(explicit, dict(get_algorithm("felo").defaults))
        summary = simulate(cfg, None, plots=False)
        rounds = read_rounds(Path(tmp) / "run")
    per_round = {d: [(r["eval"] or {}).get("client_accuracy", {}).get(d) for r in rounds
                     if r.get("phase", "train") == "train" and r.get("eval")] for d in collapsed}
    wrong = {r: [c for c, row in enumerate(v) if known[r][c] and int(np.argmax(row)) != c]
             for r, v in sorted(sent.items()) if any(known[r])}
    out = {
        "cell": cell.label, "code": provenance.code_version(), "grid_cell_code": record.get("code"),
        "collapsed": {d: {"class_counts": record["client_class_counts"][d],
                          "predictions": record["client_predictions"][d],
                          "accuracy_grid": record["client_accuracy"][d],
                          "accuracy_rerun": summary["client_accuracy"][d],
                          "accuracy_per_round": per_round[d]} for d in collapsed},
        "sent_argmax": {r: [int(np.argmax(row)) for row in v] for r, v in sorted(sent.items())},
        "known": known,
        "classes_pointing_elsewhere": wrong,
        "rounds": len(sent),
    }
    (HERE / "felo_collapse.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("cell", "collapsed")}, indent=1))
    return out


def page(data: dict | None) -> list[str]:
    """The page's section on the collapsed Felo device (empty without felo_collapse.json)."""
    if not data:
        return []
    lines = ["## The Felo device that collapsed at ε = 1 before the gradient clip "
             "(felo_collapse.json)", "",
             f"`python -m benchmarks.privacy.felo_collapse` reran `{data['cell']}` (at "
             f"{data['code']}; the grid's cell at {data['grid_cell_code']}) and recorded the "
             "global per-class logits Felo's server sends back each round (the same to every "
             "device), whose arg-max should be the class itself.", ""]
    for d, v in data["collapsed"].items():
        acc = ", ".join("—" if a is None else f"{100 * a:.1f}"
                        for a in v["accuracy_per_round"][:8])
        held = ", ".join(f"class {c}: {n}" for c, n in enumerate(v["class_counts"]) if n)
        top = int(np.argmax(v["predictions"]))
        lines.append(f"- **{d}** holds {held}; its final model predicts class {top} for "
                     f"{v['predictions'][top]} of {sum(v['predictions'])} test images (accuracy "
                     f"{100 * v['accuracy_grid']:.1f} % in the grid, "
                     f"{100 * v['accuracy_rerun']:.1f} % in the rerun); its accuracy by round: "
                     f"{acc} %, …")
    for r, bad in list(data["classes_pointing_elsewhere"].items())[:ROUNDS_SHOWN]:
        argmax = data["sent_argmax"][r]
        lines.append(f"- round {r}: the logits sent for {len(bad)} of "
                     f"{sum(data['known'][r])} classes the server knows point at another class ("
                     + ", ".join(f"{c} → {argmax[c]}" for c in bad) + ")")
    pointed = any(data["classes_pointing_elsewhere"].values())
    return lines + ["", ("The noise local DP puts on each device's per-class statistics at this ε "
                         "turns the global logits of several classes towards other classes. "
                         if pointed else "The logits sent point at their own classes. ")
                    + "Distilling towards them against its own labels, the device's local SGD "
                    "diverged in round 3 (its weights growing every step from the first "
                    "distilling round, then steps of gradient norm 33 and 94; non-finite logits "
                    "from round 4, every later upload refused): a recipe that cannot hold a "
                    "conflicting teacher, measured in [felo_recipe.md](felo_recipe.md). The "
                    "grid's Felo cells now clip each local step's gradient (its choice there, on "
                    "a validation split); this section is the run before it.", ""]

if __name__ == "__main__":
    main()
