#!/usr/bin/env bash
# One short device call (issue 19, run 77): the fat split tasks (`--variants fat`) on the
# RG_MK_SPLIT_PAGES build whose fallback page load can no longer be hoisted (run 76's build
# loaded the table each token whatever `held` said, so its K/V addresses still waited on
# it). Builds only the four persistent cubins the set names and split_kv (the graph-fused
# engine's), with issue19_build.sh's ONLY; times `megakernel_ab.py --variants fat` at b1
# and b8 (every list bitwise its family's unfused list on the tree's default cubin); then,
# with the time left, the pages build's bit-for-bit gpu test. carry [".site"]; results in $OUT.
set -u
T0=$(date +%s)
. benchmarks/device_env.sh || exit 1
K=/tmp/k/cubins
ONLY="split_kv.sm_90 mk_mma mk_mmapg mk_mmasa8pg mk_mmasa8" bash benchmarks/issue19_build.sh \
  /tmp/k > /tmp/build.txt 2>&1 || { tail -20 /tmp/build.txt; exit 1; }
grep -H "registers" "$K"/mk_*.log | tee "$OUT/registers.txt"
echo "build took $(( $(date +%s) - T0 )) s"
rm -rf /tmp/runpg && mkdir -p /tmp/runpg
timeout 240 python3 benchmarks/megakernel_ab.py --out /tmp/runpg \
  --cubins mma="$K/mk_mma.cubin" mma9="$K/mk_mma.cubin" mmapg="$K/mk_mmapg.cubin" \
  mmasa8pg="$K/mk_mmasa8pg.cubin" mmasa8="$K/mk_mmasa8.cubin" \
  --split-kv-cubin "$K/split_kv.sm_90.cubin" --variants fat --repeats 7 --batches 1 8 \
  --compile none --fused-chunks 0 2>&1 | grep -v "breakdown\|stage windows\|profile" | tail -n 45
cp /tmp/runpg/results.json "$OUT/results.json"
echo "ab took $(( $(date +%s) - T0 )) s"
ROWGATE_PERSISTENT_CUBIN="$K/mk_mma.cubin" ROWGATE_NVCC="$(command -v nvcc)" \
  timeout $(( ${LIMIT:-330} - ($(date +%s) - T0) )) python3 -m pytest -p no:cacheprovider --noconftest -m gpu \
  -q -rs tests/megakernel/test_persistent_gpu.py -k "latency_variant and pages" 2>&1 |
  tail -n 6 | tee "$OUT/pytest-variant.txt"
echo "all took $(( $(date +%s) - T0 )) s"
