#!/usr/bin/env bash
# One device call (issue 19, item 3): benchmarks/deep_tail.py, split_kv.cu's RG_DEEP_TAIL
# builds (two split sizes, short splits last, split-major; timing only) against the default
# deep build, a uniform 512-token plan and SDPA at B16x16K, each checked against float64 and
# traced; with FLUSH_AB=1 then benchmarks/deep_waves.sh --flush-ab (B16 after the write flush
# and after a read flush). No carry; ~2-4 minutes. Results: $OUT/tail.tar.gz (every sample).
set -u
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
R=/tmp/deep-tail && rm -rf "$R" && mkdir -p "$R"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu \
    --format=csv; nvcc --version | tail -1; git rev-parse HEAD 2>/dev/null; } | tee "$R/env.txt"
timeout "${TAIL_TIMEOUT:-300}" python3 benchmarks/deep_tail.py --out "$R" \
  --repeats "${REPEATS:-21}" 2>&1 | tee "$R/tail.log" | tail -n 40
tar czf "$OUT/tail.tar.gz" -C "$R" .
if [ "${FLUSH_AB:-0}" = 1 ]; then
  REPEATS="${AB_REPEATS:-21}" bash benchmarks/deep_waves.sh --flush-ab
fi
echo "total $(( $(date +%s) - T0 )) s"
