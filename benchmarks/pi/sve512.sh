#!/usr/bin/env bash
# The parity failure under QEMU's "max" CPU, taken apart (issue 18): run after run.sh, in its root.
# Installs what the [train] layer takes from the default index on aarch64 (torch 2.14.1,
# a CUDA build, with its CUDA libraries and triton; plus onnx) into /opt/train214, runs
# precision.py under CPUs that separate SVE, its vector length, SME and BF16, and a 2-round
# `edgefl train --export` under "max" against a server on this host. Writes benchmarks/pi/sve512.json,
# which report.py puts on results.md. Slow: the install took 1328 s under emulation.
set -euo pipefail
cd "$(dirname "$0")/../.."
HERE=benchmarks/pi
PI_ROOT=${PI_ROOT:-/var/tmp/edgefl-pi-root}
HOST_PY=${HOST_PY:-$PWD/.venv/bin/python}
TORCH_DEFAULT=${TORCH_DEFAULT:-torch==2.14.1}
OUT=$(mktemp -d /var/tmp/edgefl-sve512.XXXXXX)
mountpoint -q "$PI_ROOT/proc" || mount -t proc proc "$PI_ROOT/proc"
mountpoint -q "$PI_ROOT/dev" || mount --bind /dev "$PI_ROOT/dev"
trap 'umount "$PI_ROOT/proc" "$PI_ROOT/dev" 2>/dev/null || true' EXIT
pi() { local cpu=$1; shift; chroot "$PI_ROOT" /usr/bin/env -i QEMU_CPU="$cpu" HOME=/root PATH=/usr/local/bin:/usr/bin:/bin OMP_NUM_THREADS=2 \
  PYTHONUNBUFFERED=1 PIP_CERT=/etc/ssl/certs/host-ca-bundle.crt SSL_CERT_FILE=/etc/ssl/certs/host-ca-bundle.crt "$@"; }
rm -rf "$PI_ROOT/opt/edgefl/src" && mkdir -p "$PI_ROOT/opt/edgefl/src" "$PI_ROOT/opt/work"
git ls-files -z | grep -zv '^benchmarks/' | xargs -0 -I{} cp --parents {} "$PI_ROOT/opt/edgefl/src/"
cp "$HERE/precision.py" "$PI_ROOT/opt/work/precision.py"
if ! [ -x "$PI_ROOT/opt/train214/bin/edgefl" ]; then
  pi cortex-a76 python3 -m venv --without-pip /opt/train214
  pi cortex-a76 pip3 --python /opt/train214/bin/python install --quiet --no-compile --no-cache-dir "$TORCH_DEFAULT" "/opt/edgefl/src[train]" onnx
fi
"$HOST_PY" "$HERE/sizes.py" "$PI_ROOT/opt/train214" > "$OUT/sizes.json"
: > "$OUT/precision.jsonl"
for variant in cortex-a76 max max,sve=off max,sme=off a64fx max/ONEDNN_DEFAULT_FPMATH_MODE=STRICT \
    max,sve-default-vector-length=16 max,sve-default-vector-length=32 a64fx,sve-default-vector-length=32; do
  cpu=${variant%%/*}; extra=; [ "$variant" != "$cpu" ] && extra=${variant#*/}
  chroot "$PI_ROOT" /usr/bin/env -i QEMU_CPU="$cpu" $extra HOME=/root PATH=/usr/bin:/bin OMP_NUM_THREADS=2 \
    PYTHONPATH=/opt/edgefl/src /opt/train214/bin/python /opt/work/precision.py 2>/dev/null | tail -1 >> "$OUT/precision.jsonl"
done
PORT=$("$HOST_PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$HOST_PY" -m edgefl.cli.main broker start --port "$PORT" > "$OUT/broker.log" 2>&1 & BROKER=$!
OMP_NUM_THREADS=1 "$HOST_PY" -m edgefl.cli.main server start --broker "mqtt://127.0.0.1:$PORT" --fleet pi --algorithm fedavg \
  --rounds 2 --min-devices 1 --dataset synthetic --train-samples 600 --model cnn --width 0.25 --steps 3 --batch-size 16 \
  --deadline 900 --out "$OUT/server-runs" --run-name pi --json > "$OUT/server.json" 2> "$OUT/server.log" & SERVER=$!
set +e
chroot "$PI_ROOT" /usr/bin/env -i QEMU_CPU=max HOME=/root PATH=/usr/bin:/bin OMP_NUM_THREADS=2 PYTHONUNBUFFERED=1 PYTHONPATH=/opt/edgefl/src \
  /opt/train214/bin/edgefl train --broker "mqtt://127.0.0.1:$PORT" --fleet pi --device-id pi5 --data synthetic:train_samples=600 \
  --wait 120 --threads 2 --export /opt/work/pi5-max.onnx > "$OUT/train.log" 2>&1
code=$?
set -e
wait "$SERVER" || true; kill "$BROKER" 2>/dev/null || true
"$HOST_PY" - "$OUT" "$code" "$HERE/sve512.json" <<'PY'
import json, sys
from pathlib import Path
out, code, dest = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
sizes = json.loads((out / "sizes.json").read_text())
runs = [json.loads(line) for line in (out / "precision.jsonl").read_text().splitlines() if line.strip()]
dest.write_text(json.dumps({"train_default_index_sizes": sizes, "precision": runs,
                            "train_max_exit_code": code, "train_max_log": (out / "train.log").read_text()}, indent=2) + "\n")
PY
echo "wrote $HERE/sve512.json"
