#!/usr/bin/env bash
# One short device call (issue 19, run 77): the fat split tasks (`--variants fat`) on the
# RG_MK_SPLIT_PAGES build whose fallback page load can no longer be hoisted (run 76's build
# loaded the table each token whatever `held` said, so its K/V addresses still waited on
# it). Builds only the four persistent cubins the set names and split_kv's baseline unit
# (the graph-fused engine's), times `megakernel_ab.py --variants fat` at b1 and b8 (every
# list bitwise its family's unfused list on the tree's default cubin), then, with the time
# left, the pages build's bit-for-bit gpu test. carry [".site"]; results in $OUT.
set -u
T0=$(date +%s)
. benchmarks/device_env.sh || exit 1
K=/tmp/k/cubins
mkdir -p "$K"
F=(-cubin -arch=sm_90 -std=c++17 -I kernels/include -Werror all-warnings
   -Xptxas -v,-warn-spills,-warn-lmem-usage -Xcompiler -Wall,-Wextra,-Werror)
S=kernels/persistent/megakernel.cu
build() {  # name defines...
  local n=$1
  shift
  nvcc "${F[@]}" "$@" -o "$K/$n.cubin" "$S" > "$K/$n.log" 2>&1 || { cat "$K/$n.log"; return 1; }
}
build mk_mma -DRG_MK_MMA=1 & p1=$!
build mk_mmapg -DRG_MK_MMA=1 -DRG_MK_SPLIT_PAGES=1 & p2=$!
build mk_mmasa8pg -DRG_MK_MMA=1 -DRG_MK_SPLIT_PAGES=1 -DRG_MK_SPLIT_AHEAD=8 & p3=$!
build mk_mmasa8 -DRG_MK_MMA=1 -DRG_MK_SPLIT_AHEAD=8 & p4=$!
nvcc "${F[@]}" -DRG_UNIT=1 -o "$K/split_kv.sm_90.cubin" kernels/decode_attention/split_kv.cu \
  > "$K/split_kv.log" 2>&1 & p5=$!
for p in $p1 $p2 $p3 $p4 $p5; do wait "$p" || exit 1; done
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
