#!/usr/bin/env bash
# One device call (issue 19, item 3): where the deep candidate's E5M2 B16x16K time goes
# (benchmarks/deep_ceiling.py: the access pattern's read ceilings beside the kernel, and
# its compute without copies). No carry. Results: $OUT/ceiling.tar.gz and the log.
set -u
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
R=/tmp/deep-ceiling && rm -rf "$R" && mkdir -p "$R"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu \
    --format=csv; nvcc --version | tail -1; } | tee "$R/env.txt"
timeout "${CEILING_TIMEOUT:-300}" python3 benchmarks/deep_ceiling.py --out "$R" \
  --repeats "${REPEATS:-15}" 2>&1 | tee "$R/ceiling.log" | tail -n 30
tar czf "$OUT/ceiling.tar.gz" -C "$R" .
echo "deep_ceiling took $(( $(date +%s) - T0 )) s"
