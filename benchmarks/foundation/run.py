"""Foundation evidence on real Fashion-MNIST (issue: foundation).

1. FedAvg, small CNN, 10 devices IID, 5 rounds: mean test accuracy (target >= 85%).
2. Dir(0.1), 10 devices, 5 rounds: Local vs FedAvg per-device accuracy (Local should be lower).
3. The same seed twice: identical partition and first-round metrics.

Usage: .venv/bin/python benchmarks/foundation/run.py   (about 5 minutes on 2 cores)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.common import edgefl_json, machine, write_json  # noqa: E402

HERE = Path(__file__).parent
RUNS = HERE / "runs"


def main() -> None:
    base = ["--dataset", "fashion-mnist", "--model", "cnn", "--clients", "10", "--rounds", "5", "--seed", "0"]
    results = {"machine_before": machine()}
    results["fedavg_iid"] = edgefl_json("--algorithm", "fedavg", *base, "--partition", "iid", "--out", str(RUNS), "--run-name", "fedavg-iid")
    noniid = [*base, "--partition", "dirichlet", "--alpha", "0.1"]
    results["fedavg_dir0.1"] = edgefl_json("--algorithm", "fedavg", *noniid, "--out", str(RUNS), "--run-name", "fedavg-dir0.1")
    results["local_dir0.1"] = edgefl_json("--algorithm", "local", *noniid, "--out", str(RUNS), "--run-name", "local-dir0.1")
    again = edgefl_json("--algorithm", "fedavg", *noniid, "--out", str(RUNS), "--run-name", "fedavg-dir0.1-again")
    first = lambda name: json.loads((RUNS / name / "rounds.jsonl").read_text().splitlines()[0])  # noqa: E731
    fleet = lambda name: json.loads((RUNS / name / "config.json").read_text())["fleet"]  # noqa: E731
    a, b = first("fedavg-dir0.1"), first("fedavg-dir0.1-again")
    results["reproducible"] = {
        "same_partition": fleet("fedavg-dir0.1") == fleet("fedavg-dir0.1-again"),
        "same_first_round_train_loss": a["train_loss"] == b["train_loss"],
        "same_first_round_eval": a.get("eval") == b.get("eval"),
        "same_final_accuracy": again["client_accuracy"] == results["fedavg_dir0.1"]["client_accuracy"],
    }
    results["machine_after"] = machine()
    for r in results.values():
        if isinstance(r, dict):
            r.pop("run_dir", None)
    write_json(HERE / "results.json", results)
    fl, lo = results["fedavg_dir0.1"], results["local_dir0.1"]
    lines = [
        "# Foundation results (real Fashion-MNIST, CNN tier 2, 10 devices, 5 rounds, seed 0)",
        "",
        f"Machine: {results['machine_before']['cores']} cores, load {results['machine_before']['loadavg_1_5_15']} before.",
        "",
        "| run | mean device accuracy | min | max | wall s |",
        "|---|---|---|---|---|",
    ]
    for key in ("fedavg_iid", "fedavg_dir0.1", "local_dir0.1"):
        r = results[key]
        accs = list(r["client_accuracy"].values())
        lines.append(f"| {key} | {100 * r['mean_accuracy']:.2f}% | {100 * min(accs):.2f}% | {100 * max(accs):.2f}% | {r['wall_seconds']:.0f} |")
    lower = sum(lo["client_accuracy"][d] < fl["client_accuracy"][d] for d in fl["client_accuracy"])
    lines += [
        "",
        f"Dir(0.1): Local is below FedAvg on {lower} of {len(fl['client_accuracy'])} devices.",
        f"Reproducibility (same seed twice): {results['reproducible']}",
        "",
        "Commands: see `command` in results.json.",
    ]
    (HERE / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
