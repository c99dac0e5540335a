#!/usr/bin/env bash
# The emulated Raspberry Pi check (`make pi-check`): a Debian 12 arm64 root (debootstrap) run
# through qemu-user-static as a Pi 5's Cortex-A76, the base layer and [train] installed into venvs
# there, then `edgefl device profile`, `edgefl infer` on a model exported on this host, and a
# 2-round `edgefl train` in the arm64 root joining a server on this host over loopback.
# Writes benchmarks/pi/results.json and results.md. Slow (emulation): not part of CI; rerun when
# the dependencies change. Needs root, apt, and the host's full install (.venv, `make venv`).
#
#   sudo make pi-check                       # PI_ROOT=/var/tmp/edgefl-pi-root by default
#   QEMU_CPU=max sudo make pi-check          # the CPU QEMU picks by default (SVE, BF16)
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
HERE=benchmarks/pi
PI_ROOT=${PI_ROOT:-/var/tmp/edgefl-pi-root}
HOST_PY=${HOST_PY:-$REPO/.venv/bin/python}
export QEMU_CPU=${QEMU_CPU:-cortex-a76}   # the Raspberry Pi 5's core; read by qemu-aarch64
MIRROR=${MIRROR:-http://deb.debian.org/debian}
TORCH_AARCH64=${TORCH_AARCH64:-torch==2.9.1}   # a CPU build on aarch64 (PyPI)
WORK=$(mktemp -d /var/tmp/edgefl-pi-check.XXXXXX)
LOG=$WORK/log.txt
declare -A R   # results, written as JSON at the end

say() { echo "[pi-check $(date +%H:%M:%S)] $*" | tee -a "$LOG"; }
now() { date +%s.%N; }
since() { python3 -c "import sys; print(round($(now) - $1, 1))"; }

# --- the emulated root ------------------------------------------------------------------------
if ! command -v debootstrap >/dev/null || ! [ -e /usr/libexec/qemu-binfmt/aarch64-binfmt-P ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap qemu-user-static binfmt-support
fi
[ -e /proc/sys/fs/binfmt_misc/register ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
if ! [ -x "$PI_ROOT/usr/bin/python3" ]; then
  say "debootstrap Debian 12 arm64 into $PI_ROOT"
  t=$(now)
  debootstrap --arch=arm64 --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
    bookworm "$PI_ROOT" "$MIRROR" >>"$LOG" 2>&1
  since "$t" > "$PI_ROOT/.edgefl-debootstrap-seconds"
fi
R[debootstrap_seconds]=$(cat "$PI_ROOT/.edgefl-debootstrap-seconds" 2>/dev/null || echo "n/a")
R[root_python]=$(chroot "$PI_ROOT" python3 -V 2>&1)
R[qemu_cpu]=$QEMU_CPU
R[uname_m]=$(chroot "$PI_ROOT" uname -m)

# What a Pi 5's kernel shows: torch reads MIDR_EL1 from sysfs at import (and crashes without it);
# edgefl's profile reads the device-tree model. BCM2712: 4 x Cortex-A76 r4p1, MIDR 0x414fd0b1.
mkdir -p "$PI_ROOT/sys/firmware/devicetree/base" "$PI_ROOT/proc" "$PI_ROOT/dev"
printf 'Raspberry Pi 5 Model B Rev 1.0 (emulated)\0' > "$PI_ROOT/sys/firmware/devicetree/base/model"
mkdir -p "$PI_ROOT/sys/devices/system/cpu"
for f in possible present online; do echo "0-3" > "$PI_ROOT/sys/devices/system/cpu/$f"; done
for c in 0 1 2 3; do
  d="$PI_ROOT/sys/devices/system/cpu/cpu$c/regs/identification"
  mkdir -p "$d"
  echo 0x00000000414fd0b1 > "$d/midr_el1"
  echo 0x0000000000000000 > "$d/revidr_el1"
done
mountpoint -q "$PI_ROOT/proc" || mount -t proc proc "$PI_ROOT/proc"
mountpoint -q "$PI_ROOT/dev" || mount --bind /dev "$PI_ROOT/dev"
cp /etc/resolv.conf "$PI_ROOT/etc/resolv.conf"
# The host's CA bundle: on a network whose HTTPS goes through a proxy with its own CA, pip in the
# root needs it as much as the host does.
HOST_CA=${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}
cp "$HOST_CA" "$PI_ROOT/etc/ssl/certs/host-ca-bundle.crt"
cleanup() {
  [ -n "${BROKER_PID:-}" ] && kill "$BROKER_PID" 2>/dev/null || true
  [ -n "${SERVER_PID:-}" ] && kill "$SERVER_PID" 2>/dev/null || true
  umount "$PI_ROOT/proc" 2>/dev/null || true
  umount "$PI_ROOT/dev" 2>/dev/null || true
}
trap cleanup EXIT
pi() { chroot "$PI_ROOT" /usr/bin/env -i QEMU_CPU="$QEMU_CPU" HOME=/root PATH=/usr/local/bin:/usr/bin:/bin OMP_NUM_THREADS=2 PYTHONUNBUFFERED=1 \
  PIP_CERT=/etc/ssl/certs/host-ca-bundle.crt SSL_CERT_FILE=/etc/ssl/certs/host-ca-bundle.crt "$@"; }

# --- the code, and data the arm64 side reads --------------------------------------------------
R[host_load_start]=$(cut -d' ' -f1-3 /proc/loadavg)
R[commit]=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- edgefl pyproject.toml || echo "+uncommitted")
sync_src() {
  rm -rf "$PI_ROOT/opt/edgefl/src" && mkdir -p "$PI_ROOT/opt/edgefl/src" "$PI_ROOT/opt/work"
  git ls-files -z | grep -zv '^benchmarks/' | xargs -0 -I{} cp --parents {} "$PI_ROOT/opt/edgefl/src/"
}
sync_src
# What a Pi owner installs: the wheel `make dist` builds, copied to the device (docs/install-pi-jetson.md).
"$HOST_PY" -m build --wheel --outdir "$WORK/dist" . >>"$LOG" 2>&1
WHEEL_NAME=$(basename "$(ls "$WORK"/dist/edgefl_toolkit-*.whl)")
cp "$WORK/dist/$WHEEL_NAME" "$PI_ROOT/opt/work/"
WHEEL=/opt/work/$WHEEL_NAME
if [ -e /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz ]; then
  mkdir -p "$PI_ROOT/opt/data/fashion-mnist" && cp /usr/share/datasets/fashion-mnist/t10k-* /usr/share/datasets/fashion-mnist/train-* "$PI_ROOT/opt/data/fashion-mnist/"
fi

# --- the base layer -----------------------------------------------------------------------------
# As docs/install-pi-jetson.md tells a Pi user: a venv without pip of its own, filled by the
# system's pip (Debian's python3-pip, `pip --python`), without compiling bytecode at install
# (Python writes it for the modules a command imports, on first use, when the venv is writable).
sizes() { "$HOST_PY" "$HERE/sizes.py" "$1"; }
mib() { "$HOST_PY" -c 'import json,sys; print(json.loads(sys.argv[1])["total_mib"])' "$1"; }
lean_venv() { pi python3 -m venv --without-pip "$1" >>"$LOG" 2>&1; }
pip_into() { local venv=$1; shift; pi pip3 --python "$venv/bin/python" install --quiet --disable-pip-version-check --no-compile --no-cache-dir "$@" >>"$LOG" 2>&1; }
say "base layer: python3 -m venv --without-pip + pip3 --python ... install --no-compile $WHEEL_NAME (emulated)"
rm -rf "$PI_ROOT/opt/base" "$PI_ROOT/opt/plain"
t=$(now)
lean_venv /opt/base
pip_into /opt/base "$WHEEL"
R[base_install_seconds]=$(since "$t")
R[base_sizes]=$(sizes "$PI_ROOT/opt/base")
R[base_venv_mib]=$(mib "${R[base_sizes]}")
R[base_has_torch]=$(pi /opt/base/bin/python -c 'import importlib.util as u; print(u.find_spec("torch") is not None)')
R[base_has_pillow]=$(pi /opt/base/bin/python -c 'import importlib.util as u; print(u.find_spec("PIL") is not None)')
say "base: ${R[base_venv_mib]} MiB in ${R[base_install_seconds]} s; torch: ${R[base_has_torch]}; pillow: ${R[base_has_pillow]}"
# What pip's defaults would add: the bytecode of every module (measured by compiling a copy on the
# host with CPython 3.11, which writes the same .pyc files as the root's 3.11), and the pip and
# setuptools that `python3 -m venv` puts into every venv (measured in the root).
BC=$WORK/base-bytecode && rm -rf "$BC" && cp -a "$PI_ROOT/opt/base" "$BC"
PY311=${PY311:-$(command -v python3.11 || true)}
if [ -n "$PY311" ]; then
  "$PY311" -m compileall -q -j 0 "$BC"/lib/python3*/site-packages >/dev/null 2>&1 || true
  R[base_compiled_sizes]=$(sizes "$BC")
fi
rm -rf "$BC"
pi python3 -m venv /opt/plain >>"$LOG" 2>&1
R[empty_venv_with_pip_sizes]=$(sizes "$PI_ROOT/opt/plain")
rm -rf "$PI_ROOT/opt/plain"

t=$(now)
pi /opt/base/bin/edgefl device profile --json --quick > "$WORK/profile-base.json" 2>>"$LOG"
R[profile_base_seconds]=$(since "$t")
R[profile_base]=$(cat "$WORK/profile-base.json")

# --- inference on a model exported on the host ---------------------------------------------------
say "host: export a model trained on this host"
HOST_RUNS=$WORK/host-runs
if [ -d "$PI_ROOT/opt/data/fashion-mnist" ]; then DATASET=fashion-mnist; else DATASET=synthetic; fi
OMP_NUM_THREADS=1 "$HOST_PY" -m edgefl.cli.main simulate --algorithm fedavg --dataset $DATASET --model cnn --width 0.25 \
  --clients 2 --rounds 2 --steps 30 --train-samples 4000 --test-samples 1000 --seed 0 --out "$HOST_RUNS" --run-name host --quiet >>"$LOG" 2>&1
OMP_NUM_THREADS=1 "$HOST_PY" -m edgefl.cli.main export --run "$HOST_RUNS/host" --device d00 --out "$PI_ROOT/opt/work/host.onnx" --test-samples 0 >>"$LOG" 2>&1
R[infer_dataset]=$DATASET
R[infer_host]=$("$HOST_PY" -m edgefl.cli.main infer "$PI_ROOT/opt/work/host.onnx" --dataset $DATASET --limit 2000 --json 2>>"$LOG")
t=$(now)
R[infer_pi]=$(pi /opt/base/bin/edgefl infer /opt/work/host.onnx --dataset $DATASET --data-dir /opt/data/$DATASET --limit 2000 --json 2>>"$LOG")
R[infer_pi_seconds]=$(since "$t")
say "infer: host ${R[infer_host]}"
say "infer: pi   ${R[infer_pi]}"
# The same test images as PNG files need [images]; their class folders are the model's class names
# spelled otherwise (lower case, "/" -> " "), so they sort in another order than the model's.
rm -rf "$PI_ROOT/opt/work/pngs"
"$HOST_PY" - "$DATASET" "$PI_ROOT/opt/work/pngs" <<'PY' >>"$LOG" 2>&1
import sys
from pathlib import Path
from PIL import Image
from edgefl.data.sources import load_arrays
x, y, info = load_arrays(sys.argv[1], "test")
root = Path(sys.argv[2])
for i in range(500):
    d = root / info.class_names[int(y[i])].lower().replace("/", " ")
    d.mkdir(parents=True, exist_ok=True)
    Image.fromarray(x[i][0], mode="L").save(d / f"{i:04d}.png")
PY
set +e
pi /opt/base/bin/edgefl infer /opt/work/host.onnx --dataset imagefolder:/opt/work/pngs --json > "$WORK/infer-png-base.txt" 2>&1
R[infer_png_without_images_exit]=$?
set -e
R[infer_png_without_images]=$(tail -3 "$WORK/infer-png-base.txt")
R[base_after_use_sizes]=$(sizes "$PI_ROOT/opt/base")
R[base_after_use_mib]=$(mib "${R[base_after_use_sizes]}")
t=$(now)
pip_into /opt/base "$WHEEL[images]"
R[images_install_seconds]=$(since "$t")
R[images_sizes]=$(sizes "$PI_ROOT/opt/base")
R[images_venv_mib]=$(mib "${R[images_sizes]}")
R[infer_host_png500]=$("$HOST_PY" -m edgefl.cli.main infer "$PI_ROOT/opt/work/host.onnx" --dataset $DATASET --limit 500 --json 2>>"$LOG")
R[infer_pi_png]=$(pi /opt/base/bin/edgefl infer /opt/work/host.onnx --dataset imagefolder:/opt/work/pngs --json 2>>"$LOG")
say "base+[images]: ${R[images_venv_mib]} MiB; PNG folder on the pi: ${R[infer_pi_png]}"

# --- [train] --------------------------------------------------------------------------------------
say "[train]: $TORCH_AARCH64 (PyPI's aarch64 CPU build) + $WHEEL_NAME[train] (emulated)"
rm -rf "$PI_ROOT/opt/train"
t=$(now)
lean_venv /opt/train
pip_into /opt/train "$TORCH_AARCH64" "$WHEEL[train]"
R[train_install_seconds]=$(since "$t")
R[train_sizes]=$(sizes "$PI_ROOT/opt/train")
R[train_venv_mib]=$(mib "${R[train_sizes]}")
R[train_torch]=$(pi /opt/train/bin/python -c 'import torch; print(torch.__version__, "cuda" if torch.version.cuda else "cpu")' 2>>"$LOG")
say "[train]: ${R[train_venv_mib]} MiB in ${R[train_install_seconds]} s; torch ${R[train_torch]}"
# `edgefl train --export` writes ONNX: onnx belongs to [server]; a device that exports adds it.
pip_into /opt/train onnx
R[train_onnx_sizes]=$(sizes "$PI_ROOT/opt/train")
R[train_onnx_venv_mib]=$(mib "${R[train_onnx_sizes]}")
# Which side loses precision on an ARM CPU: the Pi 5's core, QEMU's "max" (SVE, BF16 ...), "max"
# without SVE, and the A64FX (SVE, no BF16); then "max" with oneDNN's fpmath mode forced to F32.
cp "$HERE/precision.py" "$PI_ROOT/opt/work/precision.py"
sync_src  # the precision runs import edgefl's export from the tree as it is now (PYTHONPATH)
R[precision_commit]=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- edgefl || echo "+uncommitted")
for variant in cortex-a76 max max,sve=off max,sme=off a64fx max/ONEDNN_DEFAULT_FPMATH_MODE=F32; do
  cpu=${variant%%/*}; extra=; [ "$variant" != "$cpu" ] && extra=${variant#*/}
  R[precision_$variant]=$(chroot "$PI_ROOT" /usr/bin/env -i QEMU_CPU=$cpu $extra HOME=/root PATH=/usr/bin:/bin OMP_NUM_THREADS=2 \
    PYTHONPATH=/opt/edgefl/src /opt/train/bin/python /opt/work/precision.py 2>>"$LOG" | tail -1)
  say "precision under QEMU_CPU=$variant: ${R[precision_$variant]}"
done
# What [train] would download from the default index on aarch64 (resolved, not installed).
timeout 900 chroot "$PI_ROOT" /usr/bin/env -i QEMU_CPU="$QEMU_CPU" HOME=/root PATH=/usr/bin:/bin PIP_CERT=/etc/ssl/certs/host-ca-bundle.crt \
  pip3 --python /opt/train/bin/python install --dry-run --ignore-installed --quiet --report /opt/work/default-train.json \
  "$WHEEL[train]" >>"$LOG" 2>&1 || true
[ -e "$PI_ROOT/opt/work/default-train.json" ] && R[default_index_train_report]=$(cat "$PI_ROOT/opt/work/default-train.json")
t=$(now)
pi /opt/train/bin/edgefl device profile --json --quick > "$WORK/profile-train.json" 2>>"$LOG"
R[profile_train_seconds]=$(since "$t")
R[profile_train]=$(cat "$WORK/profile-train.json")

# --- a 2-round run: server on the host, the device in the arm64 root --------------------------------
PORT=$("$HOST_PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$HOST_PY" -m edgefl.cli.main broker start --port "$PORT" >>"$WORK/broker.log" 2>&1 &
BROKER_PID=$!
OMP_NUM_THREADS=1 "$HOST_PY" -m edgefl.cli.main server start --broker "mqtt://127.0.0.1:$PORT" --fleet pi --algorithm fedavg \
  --rounds 2 --min-devices 1 --dataset synthetic --train-samples 600 --model cnn --width 0.25 --steps 3 --batch-size 16 \
  --deadline 900 --out "$WORK/server-runs" --run-name pi --json > "$WORK/server.json" 2>"$WORK/server.log" &
SERVER_PID=$!
say "2-round edgefl train in the arm64 root against mqtt://127.0.0.1:$PORT"
t=$(now)
set +e
pi /opt/train/bin/edgefl train --broker "mqtt://127.0.0.1:$PORT" --fleet pi --device-id pi5 --data synthetic:train_samples=600 \
  --wait 120 --threads 2 --export /opt/work/pi5.onnx > "$WORK/train.log" 2>&1
R[train_exit_code]=$?
set -e
R[train_seconds]=$(since "$t")
wait "$SERVER_PID"; R[server_exit_code]=$?
SERVER_PID=
R[train_log]=$(cat "$WORK/train.log")
R[server_summary]=$(tail -1 "$WORK/server.json")
say "train exit ${R[train_exit_code]} in ${R[train_seconds]} s; server exit ${R[server_exit_code]}"

# --- the page ---------------------------------------------------------------------------------------
R[host]=$("$HOST_PY" -c 'import platform; print(platform.machine(), platform.processor() or "")')
R[host_load]=$(cut -d' ' -f1-3 /proc/loadavg)
R[date]=$(date -u +%Y-%m-%dT%H:%M:%SZ)
for k in "${!R[@]}"; do printf '%s\0%s\0' "$k" "${R[$k]}"; done | "$HOST_PY" "$HERE/report.py" "$HERE"
say "wrote $HERE/results.json and $HERE/results.md (log: $LOG)"
