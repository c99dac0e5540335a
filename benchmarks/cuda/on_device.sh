#!/usr/bin/env bash
# The CUDA check as one command on a machine with a GPU (the project's `device` tool runs it from the
# repository root; $OUT comes back). The packages the GPU machine's image lacks travel as wheels in
# .whl/ and Fashion-MNIST in .fmnist/ (both git-ignored: .git/info/exclude), e.g.
#   pip download --no-deps --only-binary=:all: --python-version 3.12 ... -d .whl paho-mqtt pydantic ...
#   cp /usr/share/datasets/fashion-mnist/*.gz .fmnist/
# Then: every method on CPU and GPU (benchmarks/cuda/check.py), and a Felo fleet of three
# `edgefl train --train-device cuda` processes over the embedded MQTT broker, its GPU memory per
# process sampled each second, its models exported to ONNX and run under ONNX Runtime.
set -u
OUT=${OUT:-/tmp/cuda-out}
mkdir -p "$OUT"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
fi
export EDGEFL_COMMIT=${EDGEFL_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export PYTHONUNBUFFERED=1
data=${DATA_DIR:-.fmnist}
nvidia-smi -L
python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.is_available())'
python3 -m benchmarks.cuda.check --out "$OUT" --work /tmp/cc --data-dir "$data" --jobs 14 \
    > "$OUT/check.log" 2>&1
echo "check exit $?"
tail -5 "$OUT/check.log"
( while sleep 1; do nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader; done ) \
    > "$OUT/gpu_memory.csv" 2>&1 &
sampler=$!
python3 -m edgefl.cli.main simulate --transport mqtt --algorithm felo --clients 3 --rounds 3 \
    --train-samples 1500 --test-samples 500 --eval-samples 300 --width 0.25 --train-device cuda \
    --data-dir "$data" --out /tmp/mq --run-name felo-cuda --export fp32 > "$OUT/mqtt.log" 2>&1
echo "mqtt exit $?"
kill $sampler
tail -12 "$OUT/mqtt.log"
sort -u "$OUT/gpu_memory.csv" | sort -t, -k1,1 -k2,2n | tail -12
