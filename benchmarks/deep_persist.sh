#!/usr/bin/env bash
# One device call (issue 19, item 3): the deep candidate's persistent CTAs (split_kv.cu's
# RG_DEEP_PERSIST, DEEP_BUILDS "ps"), which keep a slot streaming through its epilogue.
#  1. benchmarks/issue19_deep.sh builds everything and times B16x16K E5M2 and bf16 beside
#     SDPA: main's deep candidate, its two- and three-stage builds, "ps" and "ps2" (two
#     stages), each checked bit for bit against the baseline of its own plan first;
#  2. compute-sanitizer's memcheck and racecheck run "ps" on the shapes where its CTAs take
#     several splits each (deep_sanitize.sh, deep_sanitize.py --persist) and on the small
#     shapes;
#  3. the operator gate's case matrices (E5M2, bf16, bf16 GQA 2) run on "ps" against the
#     baseline bit for bit (benchmarks/decode_attention.py --cubin), and ncu's counters on
#     its target shapes where the call has used less than NCU_BEFORE (300) seconds.
# benchmarks/probes/nsmid.cu first prints what %nsmid reads against the SM count (the
# persistent CTAs' slots). No carry; ~5-8 minutes. Results: $OUT/deep.tar.gz (step 1) and
# $OUT/persist.tar.gz (steps 2-3).
set -u
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
R=/tmp/persist && rm -rf "$R" && mkdir -p "$R"
# what %nsmid reads here (the persistent CTAs' slots) against the SM count
nvcc -arch=sm_90 -o "$R/nsmid" benchmarks/probes/nsmid.cu && "$R/nsmid" | tee "$R/nsmid.txt"
SKIP="phase ncu operator operator_bf16 operator_g2 sanitize bench_small smoke" \
  DEEP="${DEEP:-s3 s2 ps ps2}" REPEATS="${REPEATS:-15}" bash benchmarks/issue19_deep.sh
PS=build/deep/split_kv.deep_ps.sm_90.cubin
if [ ! -f "$PS" ]; then
  echo "no $PS: the build failed (see the log above)"
  exit 1
fi
SAN_TIMEOUT="${SAN_TIMEOUT:-150}" bash benchmarks/deep_sanitize.sh "$PS" "$R" -persist --persist
SAN_TIMEOUT="${SAN_TIMEOUT:-150}" bash benchmarks/deep_sanitize.sh "$PS" "$R"
# ncu on "ps" too (DRAM and issue counters beside main's in run 52) while the call has time
ncu_args=(--skip ncu)
[ $(( $(date +%s) - T0 )) -lt "${NCU_BEFORE:-300}" ] && ncu_args=()
timeout "${OP_TIMEOUT:-270}" python3 benchmarks/decode_attention.py --cubin "$PS" \
  --candidate e5m2_deep --out "$R/operator" --skip smoke --skip bench_large \
  --skip bench_small ${ncu_args[@]+"${ncu_args[@]}"} 2>&1 | tee "$R/operator.log" | grep -v "^\s*$" |
  tail -n 20
tar czf "$OUT/persist.tar.gz" -C "$R" .
echo "total $(( $(date +%s) - T0 )) s"
