"""Write results.json and results.md of the emulated Raspberry Pi check from run.sh's results
(key, value pairs separated by NUL bytes on stdin)."""

import json
import sys
from pathlib import Path


def _json(text: str):
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return text


def main(out_dir: Path) -> None:
    fields = sys.stdin.buffer.read().decode().split("\0")
    r = {k: _json(v) for k, v in zip(fields[0::2], fields[1::2], strict=False) if k}
    report = r.pop("default_index_train_report", None)
    if isinstance(report, dict):
        r["default_index_train"] = sorted(f"{i['metadata']['name']}=={i['metadata']['version']}" for i in report.get("install", []))
    (out_dir / "results.json").write_text(json.dumps(r, indent=2, sort_keys=True) + "\n")
    infer_host, infer_pi = r.get("infer_host", {}), r.get("infer_pi", {})
    profile = r.get("profile_train") if isinstance(r.get("profile_train"), dict) else r.get("profile_base", {})
    summary = r.get("server_summary") if isinstance(r.get("server_summary"), dict) else {}
    rounds_lines = [x for x in str(r.get("train_log", "")).splitlines() if "] round " in x]
    acc = lambda d: f"{100 * d['accuracy']:.2f}%" if isinstance(d, dict) and "accuracy" in d else "n/a"  # noqa: E731
    lines = [
        "# Emulated Raspberry Pi check",
        "",
        f"`sudo make pi-check` (benchmarks/pi/run.sh) at commit {r.get('commit')} on {r.get('date')}: a Debian 12 arm64 root",
        f"(debootstrap, {r.get('root_python')}, `uname -m` = {r.get('uname_m')}) run by qemu-user-static as `QEMU_CPU={r.get('qemu_cpu')}`",
        f"on a {r.get('host')} host (load average {r.get('host_load')} while it ran: other jobs shared the 2 cores).",
        "Emulation makes every time below many times slower than a real Pi; sizes are exact.",
        f"Building the root (debootstrap, emulated second stage) took {r.get('debootstrap_seconds')} s.",
        "",
        "## Install footprint (aarch64)",
        "",
        "| layer | venv size | install time (emulated) | largest packages |",
        "|---|---|---|---|",
        f"| base (`pip install edgefl`) | {r.get('base_venv_mb')} MB | {r.get('base_install_seconds')} s | {r.get('base_largest')} |",
        f"| `[train]` with PyPI's aarch64 CPU torch ({r.get('train_torch')}) | {r.get('train_venv_mb')} MB | {r.get('train_install_seconds')} s | {r.get('train_largest')} |",
        "",
        f"The base venv holds torch: {r.get('base_has_torch')}. Target: base layer <= 150 MB.",
        f"With onnx added (what `edgefl train --export` needs; onnx is part of `[server]`): {r.get('train_onnx_venv_mb')} MB.",
        "",
        "`[train]` from the default index on aarch64 resolves to (pip --dry-run in the arm64 root):",
        f"{', '.join(r['default_index_train']) if isinstance(r.get('default_index_train'), list) else 'n/a'}.",
        "",
        "## Precision on ARM (QEMU_CPU=cortex-a76 vs QEMU's `max`, which has SVE and BF16)",
        "",
        "Max |error| against the same computation in float64 (benchmarks/pi/precision.py):",
        "",
        "| CPU | torch capability | matmul fp32 | CNN torch fp32 | CNN torch, oneDNN off | CNN ONNX Runtime |",
        "|---|---|---|---|---|---|",
        *[
            f"| {cpu} | {p.get('cpu_capability')} | {p.get('matmul_fp32_vs_fp64'):.2g} | {p.get('cnn_torch_fp32_vs_fp64'):.2g} | "
            f"{p.get('cnn_torch_fp32_no_onednn_vs_fp64'):.2g} | {p.get('cnn_ort_fp32_vs_fp64') if isinstance(p.get('cnn_ort_fp32_vs_fp64'), str) else format(p.get('cnn_ort_fp32_vs_fp64'), '.2g')} |"
            for cpu, p in ((c, r.get(f"precision_{c}")) for c in ("cortex-a76", "max")) if isinstance(p, dict)
        ],
        "",
        "## The device path",
        "",
        f"- `edgefl device profile` (base layer, no torch): {r.get('profile_base_seconds')} s; "
        f"board {r.get('profile_base', {}).get('board') if isinstance(r.get('profile_base'), dict) else 'n/a'}, "
        f"kind {r.get('profile_base', {}).get('kind') if isinstance(r.get('profile_base'), dict) else 'n/a'}.",
        f"- `edgefl device profile` ([train]): {r.get('profile_train_seconds')} s; kind {profile.get('kind')}, "
        f"torch {profile.get('torch')}, train {profile.get('train_images_per_s')} images/s (emulated).",
        f"- `edgefl infer` of a model exported on the host, on {r.get('infer_dataset')} test: host {acc(infer_host)}, "
        f"arm64 root {acc(infer_pi)} ({r.get('infer_pi_seconds')} s emulated, base layer).",
        f"- `edgefl train` in the arm64 root, 2 rounds of FedAvg against a server on the host over loopback: "
        f"exit code {r.get('train_exit_code')} after {r.get('train_seconds')} s; server exit code {r.get('server_exit_code')}, "
        f"rounds {summary.get('rounds', 'n/a')}, mean accuracy {summary.get('mean_accuracy', 'n/a')}.",
        "",
        "The device's lines (its per-round lines and the export's parity check):",
        "",
        "```",
        *[x for x in str(r.get("train_log", "")).splitlines() if x.startswith("[pi5]") or "error" in x.lower()][-20:],
        "```",
        "",
        f"Per-round lines seen: {len(rounds_lines)}.",
    ]
    (out_dir / "results.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
