#!/usr/bin/env bash
# One device call (issue 19, item 3): the split-KV deep candidate (docs/kernels.md) on the
# device's own nvcc. benchmarks/decode_attention.py builds split_kv.cu (and the deep
# candidate's build variants), checks every sm_90+ candidate bit for bit against its
# baseline on the smoke shapes, times B16x16K (E5M2 and bf16, beside SDPA; the deep
# candidate and its build variants) and B1x1K (beside the launch floor), runs the
# operator gate's case matrices with the deep candidate (E5M2, bf16, bf16 GQA 2) and ncu on
# the target shapes; then compute-sanitizer's memcheck and racecheck run the deep kernels
# on small shapes (benchmarks/deep_sanitize.sh). SKIP="ncu operator sanitize ..." skips sections;
# DEEP="s2 s3 ..." times only those of the deep candidate's build variants.
# No Python packages beyond the device image's are needed (no carry). Results:
# $OUT/deep.tar.gz and the log's summary.
set -u
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
R=/tmp/deep && rm -rf "$R" && mkdir -p "$R"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu \
    --format=csv; nvcc --version | tail -1; } | tee "$R/env.txt"
args=(--skip phase)
for s in ${SKIP:-}; do args+=(--skip "$s"); done
[ -n "${DEEP:-}" ] && args+=(--deep-builds $DEEP)  # DEEP="s2 s3": those build variants
timeout "${DA_TIMEOUT:-420}" python3 benchmarks/decode_attention.py --out "$R/da" \
  --candidate e5m2_deep --repeats "${REPEATS:-15}" "${args[@]}" 2>&1 | tee "$R/da.log" |
  grep -v "^\s*$" | tail -n 40
echo "decode_attention took $(( $(date +%s) - T0 )) s"
if [[ " ${SKIP:-} " != *" sanitize "* ]] && [ -f build/ops/sm_90/split_kv.cubin ]; then
  bash benchmarks/deep_sanitize.sh build/ops/sm_90/split_kv.cubin "$R"
fi
tar czf "$OUT/deep.tar.gz" -C "$R" .
echo "total $(( $(date +%s) - T0 )) s"
