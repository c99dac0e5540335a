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
rm -rf "$PI_ROOT/opt/edgefl/src" && mkdir -p "$PI_ROOT/opt/edgefl/src" "$PI_ROOT/opt/work"
git ls-files -z | grep -zv '^benchmarks/' | xargs -0 -I{} cp --parents {} "$PI_ROOT/opt/edgefl/src/"
if [ -e /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz ]; then
  mkdir -p "$PI_ROOT/opt/data/fashion-mnist" && cp /usr/share/datasets/fashion-mnist/t10k-* /usr/share/datasets/fashion-mnist/train-* "$PI_ROOT/opt/data/fashion-mnist/"
fi

# --- the base layer -----------------------------------------------------------------------------
size_mb() { du -sm "$1" | cut -f1; }
largest() {  # the five largest installed packages of a venv, "name MB"
  du -sm "$1"/lib/python3*/site-packages/* 2>/dev/null | sort -rn | head -5 | awk '{n=split($2,p,"/"); printf "%s %s MB; ", p[n], $1}'
}
say "base layer: python3 -m venv + pip install edgefl (emulated)"
rm -rf "$PI_ROOT/opt/base"
t=$(now)
pi python3 -m venv /opt/base >>"$LOG" 2>&1
pi /opt/base/bin/pip install --quiet --disable-pip-version-check /opt/edgefl/src >>"$LOG" 2>&1
R[base_install_seconds]=$(since "$t")
R[base_venv_mb]=$(size_mb "$PI_ROOT/opt/base")
R[base_largest]=$(largest "$PI_ROOT/opt/base")
R[base_has_torch]=$(pi /opt/base/bin/python -c 'import importlib.util as u; print(u.find_spec("torch") is not None)')
say "base: ${R[base_venv_mb]} MB in ${R[base_install_seconds]} s; torch: ${R[base_has_torch]}"

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

# --- [train] --------------------------------------------------------------------------------------
say "[train]: $TORCH_AARCH64 (PyPI's aarch64 CPU build) + edgefl[train] (emulated)"
rm -rf "$PI_ROOT/opt/train"
t=$(now)
pi python3 -m venv /opt/train >>"$LOG" 2>&1
pi /opt/train/bin/pip install --quiet --disable-pip-version-check "$TORCH_AARCH64" "/opt/edgefl/src[train]" >>"$LOG" 2>&1
R[train_install_seconds]=$(since "$t")
R[train_venv_mb]=$(size_mb "$PI_ROOT/opt/train")
R[train_largest]=$(largest "$PI_ROOT/opt/train")
R[train_torch]=$(pi /opt/train/bin/python -c 'import torch; print(torch.__version__, "cuda" if torch.version.cuda else "cpu")' 2>>"$LOG")
say "[train]: ${R[train_venv_mb]} MB in ${R[train_install_seconds]} s; torch ${R[train_torch]}"
# `edgefl train --export` writes ONNX: onnx belongs to [server]; a device that exports adds it.
pi /opt/train/bin/pip install --quiet --disable-pip-version-check onnx >>"$LOG" 2>&1
R[train_onnx_venv_mb]=$(size_mb "$PI_ROOT/opt/train")
# Which side loses precision on an ARM CPU with BF16/SVE: the Pi 5's core, then QEMU's "max".
cp "$HERE/precision.py" "$PI_ROOT/opt/work/precision.py"
for cpu in cortex-a76 max; do
  R[precision_$cpu]=$(chroot "$PI_ROOT" /usr/bin/env -i QEMU_CPU=$cpu HOME=/root PATH=/usr/bin:/bin OMP_NUM_THREADS=2 \
    PYTHONPATH=/opt/edgefl/src /opt/train/bin/python /opt/work/precision.py 2>>"$LOG" | tail -1)
  say "precision under QEMU_CPU=$cpu: ${R[precision_$cpu]}"
done
# What [train] would download from the default index on aarch64 (resolved, not installed).
timeout 900 chroot "$PI_ROOT" /usr/bin/env -i QEMU_CPU="$QEMU_CPU" HOME=/root PATH=/usr/bin:/bin PIP_CERT=/etc/ssl/certs/host-ca-bundle.crt /opt/train/bin/pip install --dry-run --ignore-installed --quiet --report /opt/work/default-train.json \
  "/opt/edgefl/src[train]" >>"$LOG" 2>&1 || true
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
R[commit]=$(git rev-parse --short HEAD)
for k in "${!R[@]}"; do printf '%s\0%s\0' "$k" "${R[$k]}"; done | "$HOST_PY" "$HERE/report.py" "$HERE"
say "wrote $HERE/results.json and $HERE/results.md (log: $LOG)"
