#!/usr/bin/env bash
# One device call (issue 19, run 79): the split loop with its next R tokens' K/V rows held
# raw and the group a template argument (RG_MK_SPLIT_RAW=R, R = 2 / 4 / 8), after run 78's
# source counters found the default loop waiting on its "next token" loads at once. Builds
# split_kv (the graph-fused engine's) and the four persistent cubins with issue19_build.sh's
# ONLY; times `megakernel_ab.py --variants raw` at b1, b4 and b8 (every list bitwise its
# family's unfused list on the tree's default cubin, greedy tokens against eager); then,
# with the time left, the raw build's bit-for-bit gpu test on the tiny model (D 64, group
# 2: the loop's other row width). carry [".site"] (benchmarks/device_site.sh pydantic
# pydantic_core annotated_types typing_inspection); results in $OUT.
# SET=rawl2 (run 81) times the raw4 build with RG_MK_SPLIT_L2=1 beside it instead, at b1
# and b8 (`--variants rawl2`), checks that build and raw0 bit for bit against the default,
# and with the time left runs every other persistent gpu test on raw4 (the default since
# 9e8d231). SET=fat is run 77's call (issue19_pages.sh): the fat split tasks on the
# RG_MK_SPLIT_PAGES and 8-ahead builds, and the pages build's bit-for-bit test.
set -u
SET=${SET:-raw}
T0=$(date +%s)
left() { echo $(( ${LIMIT:-560} - ($(date +%s) - T0) )); }  # seconds; timeout 0 never ends
. benchmarks/device_env.sh || exit 1
K=/tmp/k/cubins
case "$SET" in
  rawl2) BUILDS="mk_mmaraw4 mk_mmaraw4l2" BATCHES="1 8"
         CHECK="latency_variant and (rawl2 or raw0)" ;;
  fat) BUILDS="mk_mmapg mk_mmasa8pg mk_mmasa8" BATCHES="1 8" CHECK="latency_variant and pages" ;;
  *) BUILDS="mk_mmaraw2 mk_mmaraw4 mk_mmaraw8" BATCHES="1 4 8" BASE=mk_mmaraw0
     CHECK="latency_variant and raw and not rawl2" ;;
esac
# SET=raw's "default loop" lists are run 79's default, the one-token-ahead loop: since
# 9e8d231 the tree's default is raw4, so that set's base is the RG_MK_SPLIT_RAW=0 build
BASE=${BASE:-mk_mma}
ONLY="split_kv.sm_90 mk_mma $BASE $BUILDS" bash benchmarks/issue19_build.sh \
  /tmp/k > /tmp/build.txt 2>&1 || { tail -20 /tmp/build.txt; exit 1; }
CUBINS=(mma="$K/$BASE.cubin" mma9="$K/$BASE.cubin")
for b in $BUILDS; do CUBINS+=("${b#mk_}=$K/$b.cubin"); done
grep -H "registers" "$K"/mk_*.log | tee "$OUT/registers.txt"
echo "build took $(( $(date +%s) - T0 )) s"
rm -rf /tmp/runraw && mkdir -p /tmp/runraw
timeout "${AB_LIMIT:-330}" python3 benchmarks/megakernel_ab.py --out /tmp/runraw \
  --cubins "${CUBINS[@]}" \
  --split-kv-cubin "$K/split_kv.sm_90.cubin" --variants "$SET" --repeats 7 --batches $BATCHES \
  --compile none --fused-chunks 0 2>&1 | grep -v "breakdown\|stage windows\|profile" | tail -n 70
cp /tmp/runraw/results.json "$OUT/results.json"
echo "ab took $(( $(date +%s) - T0 )) s"
if [ "$(left)" -gt 30 ]; then
  persistent_gpu_tests "$(left)" "$CHECK" "$OUT/pytest-variant.txt" "$K/mk_mma.cubin"
fi
if [ "$SET" = rawl2 ] && [ "$(left)" -gt 30 ]; then  # every persistent gpu test on the
  # default (raw4 since 9e8d231: the flip's own check on a GPU)
  persistent_gpu_tests "$(left)" "not latency_variant" "$OUT/pytest-raw4-suite.txt" \
    "$K/mk_mmaraw4.cubin"
fi
echo "all took $(( $(date +%s) - T0 )) s"
