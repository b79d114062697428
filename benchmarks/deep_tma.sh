#!/usr/bin/env bash
# One device call (issue 19, item 3): the deep candidate with tensor copies
# (benchmarks/deep_tma.py: build at each ring depth, bit-for-bit check against the deep
# unit's baseline, B16x16K and B1x1K beside the default deep candidate, ncu), then
# compute-sanitizer's memcheck on the check matrix's small cases. No carry. Results:
# $OUT/deept.tar.gz and the log's summary.
set -u
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
R=/tmp/deept && rm -rf "$R" && mkdir -p "$R"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu \
    --format=csv; nvcc --version | tail -1; git log -1 --format=%H 2>/dev/null; } | tee "$R/env.txt"
timeout "${TMA_TIMEOUT:-480}" python3 benchmarks/deep_tma.py --out "$R" --build /tmp/deept-build \
  --repeats "${REPEATS:-15}" ${NCU:+--ncu} 2>&1 | tee "$R/deept.log" | grep -v "^\[check\]" | tail -n 40
grep -c "False" "$R/deept.log" | sed 's/^/check lines with a mismatch: /'
cp /tmp/deept-build/build.log "$R/" 2>/dev/null
tar czf "$OUT/deept.tar.gz" -C "$R" .
echo "total $(( $(date +%s) - T0 )) s"
