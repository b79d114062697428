#!/usr/bin/env bash
# One device call: the trace capture set (eager vs graph verdict + GPU fixtures) and
# `rowgate gate ROW` on the H200, everything under $OUT. Run from the repo root with
# `.whl` carried (the Python packages the device image lacks, see docs/operators.md):
#   bash benchmarks/device_gate.sh KERNEL-CUDA-DECODE-MEGAKERNEL
set -uo pipefail
row="${1:?row id}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 ROWGATE_SIGNER=key
export XDG_CONFIG_HOME=/tmp/rowgate-config
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,driver_version --format=csv
nvcc --version | tail -2
# The device receives a copy of the working tree without .git: the subject is that
# tree committed as one signed-off commit on a fresh main (recorded as such).
if ! git rev-parse --verify -q HEAD >/dev/null 2>&1; then
  rm -rf .git && git init -q -b main . && git add -A . && \
  git -c user.name=rowgate-device -c user.email=device@rowgate.dev commit -qs \
    -m "device snapshot of the working tree" || exit 1
fi
[ -n "${SKIP_TRACE:-}" ] || timeout 300 python3 benchmarks/trace_capture.py --device cuda --out "$OUT" 2>&1 | tee "$OUT/trace-log.txt"
timeout 240 python3 -m pipeline.cli gate "$row" --out /tmp/evidence \
  --option nvcc="$(command -v nvcc)" 2>&1 | tee "$OUT/gate-log.txt"
cp "$XDG_CONFIG_HOME/rowgate/signing-key.pub.pem" "$OUT/device-key.pub.pem" 2>/dev/null
# the device returns files of at most 16 MiB: split the sealed evidence
tar czf - -C /tmp evidence | split -b 15M - "$OUT/evidence.tar.gz.part-"
ls -la "$OUT"
