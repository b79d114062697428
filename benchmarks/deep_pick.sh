#!/usr/bin/env bash
# One device call (issue 19, item 3): the deep candidate's build variants that could replace
# its default, timed and the fastest checked whole. PICK names them (DEEP_BUILDS of
# benchmarks/decode_attention.py; required); DEEP the builds timed beside them (default
# "s3 s2" and PICK's).
#  1. benchmarks/issue19_deep.sh builds everything and times B16x16K E5M2 and bf16 beside
#     SDPA, each build checked bit for bit against the baseline of its own plan first;
#  2. compute-sanitizer's memcheck and racecheck run the fastest of PICK
#     (benchmarks/deep_pick.py: bitwise, least E5M2 + bf16 median) on the small shapes
#     (deep_sanitize.sh);
#  3. the operator gate's case matrices (E5M2, bf16, bf16 GQA 2) run on that build against
#     the baseline bit for bit (benchmarks/decode_attention.py --cubin), with ncu's counters
#     on its target shapes where the call has used less than NCU_BEFORE (300) seconds; where
#     less than OP_NEEDS (200) seconds of the call's 600 are left, step 3 is not started and
#     the line to run it in the next call is printed instead.
# No carry; ~2-9 minutes. Results: $OUT/deep.tar.gz (step 1) and $OUT/pick.tar.gz (2-3).
set -u
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
[ -n "${PICK:-}" ] || { echo "deep_pick.sh: PICK names no build (DEEP_BUILDS)" >&2; exit 2; }
R=/tmp/pick && rm -rf "$R" && mkdir -p "$R"
left() { echo $(( ${CALL_LIMIT:-590} - ($(date +%s) - T0) )); }
SKIP="phase ncu operator operator_bf16 operator_g2 sanitize bench_small smoke" \
  DEEP="${DEEP:-s3 s2 $PICK}" REPEATS="${REPEATS:-15}" bash benchmarks/issue19_deep.sh
cubin() { echo "build/deep/split_kv.deep_$1.sm_90.cubin"; }
for b in $PICK; do
  if [ ! -f "$(cubin $b)" ]; then
    echo "no $(cubin $b): the build failed (see the log above)"
    exit 1
  fi
done
# the fastest of PICK at B16x16K (E5M2 + bf16 medians), the one steps 2-3 check whole
first=${PICK%% *}
BEST=$(python3 benchmarks/deep_pick.py /tmp/deep/da/results.json $PICK)
echo "fastest of $PICK: ${BEST:-none ($first checked)}" | tee "$R/best.txt"
BEST=${BEST:-$first}
SAN_TIMEOUT="${SAN_TIMEOUT:-150}" bash benchmarks/deep_sanitize.sh "$(cubin "$BEST")" "$R" "-$BEST"
op_cmd="python3 benchmarks/decode_attention.py --cubin $(cubin "$BEST") --candidate e5m2_deep \
--out $R/operator --skip smoke --skip bench_large --skip bench_small"
if [ "$(left)" -lt "${OP_NEEDS:-200}" ]; then
  echo "operator matrices not started ($(left) s left); next call: $op_cmd" | tee "$R/operator.txt"
else
  # ncu on it too (DRAM and issue counters beside main's in run 52) while the call has time
  [ $(( $(date +%s) - T0 )) -lt "${NCU_BEFORE:-300}" ] || op_cmd+=" --skip ncu"
  t=$(left); [ "$t" -gt 270 ] && t=270
  timeout "$t" $op_cmd 2>&1 | tee "$R/operator.log" | grep -v "^\s*$" | tail -n 20
fi
tar czf "$OUT/pick.tar.gz" -C "$R" .
echo "total $(( $(date +%s) - T0 )) s"
