"""Write results.json and results.md of the emulated Raspberry Pi check from run.sh's results
(key, value pairs separated by NUL bytes on stdin)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

PRECISION_VARIANTS = (
    "cortex-a76",
    "max",
    "max,sve=off",
    "max,sme=off",
    "a64fx",
    "max/ONEDNN_DEFAULT_FPMATH_MODE=F32",
)


def _json(text: str):
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return text


def _d(value) -> dict:
    return value if isinstance(value, dict) else {}


def _mib(sizes) -> str:
    s = _d(sizes)
    return f"{s['total_mib']} MiB ({s['total_mb']} MB)" if "total_mib" in s else "n/a"


def _largest(sizes, n: int = 6) -> str:
    per = _d(sizes).get("per_distribution_mib", {})
    return ", ".join(f"{k} {v}" for k, v in list(per.items())[:n]) or "n/a"


def _acc(d) -> str:
    d = _d(d)
    return f"{100 * d['accuracy']:.2f}% of {d.get('samples', '?')}" if "accuracy" in d else "n/a"


def _g(value) -> str:
    return (
        format(value, ".2g")
        if isinstance(value, (int, float))
        else str(value if value is not None else "n/a")
    )


def precision_rows(r: dict) -> list[str]:
    rows = []
    for variant in PRECISION_VARIANTS:
        p = r.get(f"precision_{variant}")
        if not isinstance(p, dict):
            if p:
                rows.append(f"| {variant} | failed: {str(p)[:120]} |" + " |" * 9)
            continue
        export = _d(p.get("edgefl_export"))
        verdict = (
            ("passes, max " + _g(max(export["parity"].values())))
            if export.get("ok")
            else ("**fails**: " + str(export.get("error", "n/a"))[:140])
        )
        rows.append(
            f"| `{variant}` | {p.get('cpu_features') or '-'} | {p.get('cpu_capability')} | "
            f"{_g(p.get('matmul_torch_fp32_vs_fp64'))} | "
            f"{_g(p.get('matmul_ort_fp32_vs_fp64'))} | "
            f"{_g(p.get('matmul_ort_bf16_fastmath_on_vs_fp64'))} | "
            f"{_g(p.get('cnn_torch_fp32_vs_fp64'))} / {_g(p.get('cnn_torch_batch1_vs_fp64'))} | "
            f"{_g(p.get('cnn_torch_fp32_no_onednn_vs_fp64'))} | "
            f"{_g(p.get('cnn_ort_fp32_vs_fp64'))} / {_g(p.get('cnn_ort_batch1_vs_fp64'))} | "
            f"{verdict} |"
        )
    return rows


def main(out_dir: Path, from_json: bool = False) -> None:
    if from_json:  # rewrite results.md from a results.json written before (the page's text changed)
        r = json.loads((out_dir / "results.json").read_text())
    else:
        fields = sys.stdin.buffer.read().decode().split("\0")
        r = {k: _json(v) for k, v in zip(fields[0::2], fields[1::2], strict=False) if k}
        report = r.pop("default_index_train_report", None)
        if isinstance(report, dict):
            r["default_index_train"] = sorted(
                f"{i['metadata']['name']}=={i['metadata']['version']}"
                for i in report.get("install", [])
            )
        (out_dir / "results.json").write_text(json.dumps(r, indent=2, sort_keys=True) + "\n")

    base, compiled, plain = (
        _d(r.get("base_sizes")),
        _d(r.get("base_compiled_sizes")),
        _d(r.get("empty_venv_with_pip_sizes")),
    )
    bytecode = (
        round(compiled["total_mib"] - base["total_mib"], 1)
        if "total_mib" in compiled and "total_mib" in base
        else "n/a"
    )
    pip_tools = {k: v for k, v in plain.get("per_distribution_mib", {}).items()}
    summary = _d(r.get("server_summary"))
    train_log = str(r.get("train_log", ""))
    round_lines = [x for x in train_log.splitlines() if "round" in x.lower()]
    profile_base, profile_train = _d(r.get("profile_base")), _d(r.get("profile_train"))
    default_train = r.get("default_index_train")
    train_pkgs = ", ".join(default_train) if isinstance(default_train, list) else "n/a"
    png_out = r.get("infer_png_without_images")
    png_last = str(png_out).strip().splitlines()[-1][:200] if png_out else "n/a"
    lines = [
        "# Emulated Raspberry Pi check",
        "",
        f"`sudo make pi-check` (benchmarks/pi/run.sh) at commit {r.get('commit')} on "
        f"{r.get('date')}: a Debian 12 arm64 root",
        f"(debootstrap, {r.get('root_python')}, `uname -m` = {r.get('uname_m')}) run by "
        f"qemu-user-static as `QEMU_CPU={r.get('qemu_cpu')}`",
        f"(the Raspberry Pi 5's core) on a {r.get('host')} host with 2 cores shared with other "
        "jobs: load average",
        f"{r.get('host_load_start')} at the start, {r.get('host_load')} at the end. Emulation "
        "under that load makes every time",
        "below many times slower than a real Pi; sizes are exact. Building the root (debootstrap, "
        "emulated second stage)",
        f"took {r.get('debootstrap_seconds')} s.",
        *([f"({r['commit_note']}.)"] if r.get("commit_note") else []),
        "",
        "## Install footprint (aarch64)",
        "",
        "Every layer is installed as docs/install-pi-jetson.md says: `python3 -m venv "
        "--without-pip`, then the system's",
        "pip (`pip3 --python VENV/bin/python install --no-compile --no-cache-dir ...`). Sizes are "
        "disk usage",
        "(benchmarks/pi/sizes.py: allocated blocks, each file once, attributed to its "
        "distribution by the RECORD of its",
        "wheel, bundled libraries such as numpy.libs/ included). MiB = 2^20 bytes, MB = 10^6.",
        "",
        "| layer | venv size | install (emulated) | largest distributions (MiB) |",
        "|---|---|---|---|",
        f"| base: `edgefl` | **{_mib(base)}** | {r.get('base_install_seconds')} s | "
        f"{_largest(base)} |",
        "| base after `device profile` and `infer` (bytecode written on first use) | "
        f"{_mib(r.get('base_after_use_sizes'))} | | bytecode "
        f"{_d(r.get('base_after_use_sizes')).get('bytecode_mib', 'n/a')} MiB |",
        f"| base + `[images]` (pillow) | {_mib(r.get('images_sizes'))} | "
        f"+{r.get('images_install_seconds')} s | pillow "
        f"{_d(r.get('images_sizes')).get('per_distribution_mib', {}).get('pillow', 'n/a')} |",
        f"| `[train]` with PyPI's aarch64 torch ({r.get('train_torch')}) | "
        f"{_mib(r.get('train_sizes'))} | {r.get('train_install_seconds')} s | "
        f"{_largest(r.get('train_sizes'))} |",
        f"| `[train]` + onnx (for `edgefl train --export`) | {_mib(r.get('train_onnx_sizes'))} | "
        "| onnx "
        f"{_d(r.get('train_onnx_sizes')).get('per_distribution_mib', {}).get('onnx', 'n/a')} |",
        "",
        f"The base venv holds torch: {r.get('base_has_torch')}; pillow: "
        f"{r.get('base_has_pillow')}. Target: base layer <= 150 MB.",
        "",
        "What pip's defaults would add to the base layer: the bytecode of every module, "
        f"{bytecode} MiB (compiling a copy of the base venv with CPython 3.11 on the host, which "
        "writes the same .pyc files),",
        "and the pip and setuptools that a plain `python3 -m venv` puts into every venv: "
        f"{_mib(plain)} for an empty venv "
        f"({', '.join(f'{k} {v}' for k, v in pip_tools.items()) or 'n/a'} MiB).",
        "",
        "`[train]` from the default index on aarch64 resolves to (pip --dry-run in the arm64 "
        "root):",
        f"{train_pkgs}.",
        "",
        "## Precision on ARM CPUs (benchmarks/pi/precision.py)",
        "",
        "Max |error| against the same computation in float64, under each emulated CPU (features "
        "from the auxiliary",
        "vector; 'a / b' = batch of 32 / batches of 1), and whether edgefl's `export_model` "
        "passes its parity check",
        f"(code at {r.get('precision_commit')}). The CNN is an untrained `cnn` width 0.25 (logits "
        "~0.3); the matmul is 64x256 @ 256x256.",
        "",
        "| QEMU_CPU | features | torch capability | matmul torch | matmul ORT | matmul ORT, bf16 "
        "fastmath on | CNN torch | CNN torch, oneDNN off | CNN ORT | edgefl export |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *precision_rows(r),
        "",
        "## The device path",
        "",
        f"- `edgefl device profile` (base layer, no torch): {r.get('profile_base_seconds')} s; "
        f"board {profile_base.get('board', 'n/a')}, "
        f"kind {profile_base.get('kind', 'n/a')}, cores {profile_base.get('cores', 'n/a')}.",
        f"- `edgefl device profile` ([train]): {r.get('profile_train_seconds')} s; kind "
        f"{profile_train.get('kind', 'n/a')}, "
        f"torch {profile_train.get('torch', 'n/a')}, train "
        f"{profile_train.get('train_images_per_s', 'n/a')} images/s (emulated).",
        f"- `edgefl infer` of a model exported on the host, {r.get('infer_dataset')} test set: "
        f"host {_acc(r.get('infer_host'))}, "
        f"arm64 root {_acc(r.get('infer_pi'))} ({r.get('infer_pi_seconds')} s emulated, base "
        "layer).",
        "- The first 500 of those test images as PNGs, in class folders named after the model's "
        "classes in lower case "
        f"with '/' as a space (so they sort in another order than the model's): without `[images]` "
        f"exit code {r.get('infer_png_without_images_exit')} "
        f"(`{png_last}`); "
        f"with it {_acc(r.get('infer_pi_png'))}, against {_acc(r.get('infer_host_png500'))} for "
        "the built-in test set on the host.",
        "- `edgefl train` in the arm64 root, 2 rounds of FedAvg against a server on the host "
        "over loopback: "
        f"exit code {r.get('train_exit_code')} after {r.get('train_seconds')} s; server exit code "
        f"{r.get('server_exit_code')}, "
        f"rounds {summary.get('rounds', 'n/a')}, mean accuracy "
        f"{summary.get('mean_accuracy', 'n/a')}.",
        "",
        "The device's output:",
        "",
        "```",
        *train_log.splitlines()[-25:],
        "```",
        "",
        f"Per-round lines seen: {len(round_lines)}.",
    ]
    lines += sve512_section(out_dir / "sve512.json")
    (out_dir / "results.md").write_text("\n".join(lines) + "\n")


def sve512_section(path: Path) -> list[str]:
    """The page's part for benchmarks/pi/sve512.sh's results, when that script has run."""
    if not path.exists():
        return []
    d = json.loads(path.read_text())
    sizes = _d(d.get("train_default_index_sizes"))
    per = sizes.get("per_distribution_mib", {})
    cuda = round(sum(v for k, v in per.items() if k.startswith(("nvidia", "cuda", "triton"))), 1)
    rows = []
    for p in d.get("precision", []):
        export = _d(p.get("edgefl_export"))
        verdict = (
            ("passes, max " + _g(max(export["parity"].values())))
            if export.get("ok")
            else "**refused**"
        )
        mode = (
            f", ONEDNN_DEFAULT_FPMATH_MODE={p['ONEDNN_DEFAULT_FPMATH_MODE']}"
            if p.get("ONEDNN_DEFAULT_FPMATH_MODE")
            else ""
        )
        rows.append(
            f"| `{p.get('qemu_cpu')}`{mode} | {p.get('cpu_features') or '-'} | "
            f"{p.get('cpu_capability')} | "
            f"{_g(p.get('cnn_torch_fp32_vs_fp64'))} | "
            f"{_g(p.get('cnn_torch_fp32_no_onednn_vs_fp64'))} | "
            f"{_g(p.get('cnn_ort_fp32_vs_fp64'))} | {verdict} |"
        )
    torch_version = next((p.get("torch") for p in d.get("precision", [])), "n/a")
    return [
        "",
        "## The default index's torch on aarch64, and the parity failure under `max` "
        "(benchmarks/pi/sve512.sh)",
        "",
        f"The `[train]` layer from the default index on aarch64 installs torch {torch_version} (a "
        "CUDA build) with its",
        "CUDA libraries and triton: the venv (with onnx, and the bytecode its runs wrote) is "
        f"{_mib(sizes)}, {cuda} MiB of it CUDA libraries and triton",
        f"({_largest(sizes, 5)} MiB). With that torch, max |error| against float64 of the same "
        "CNN:",
        "",
        "| QEMU_CPU | features | torch capability | CNN torch | CNN torch, oneDNN off | CNN ONNX "
        "Runtime | edgefl export |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        "A 2-round `edgefl train --export` under `max` with that torch: exit code "
        f"{d.get('train_max_exit_code')}:",
        "",
        "```",
        *[
            x
            for x in str(d.get("train_max_log", "")).splitlines()
            if x.startswith(("[pi5]", "error"))
        ][-8:],
        "```",
    ]


if __name__ == "__main__":
    main(Path(sys.argv[1]), from_json="--from-json" in sys.argv[2:])
