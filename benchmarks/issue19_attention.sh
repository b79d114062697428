#!/usr/bin/env bash
# One device call (issue 19): the attention phase's dependent loads. Builds the tree's
# persistent kernel and its RG_MK_SPLIT_AHEAD=8, RG_MK_MERGE_ONE_TRIP=1 and
# RG_MK_SKIP_EMPTY=1 variants on the device (benchmarks/issue19_build.sh); checks the three
# at once bit for bit against the tree's kernel on the tiny model (the gpu test, in its own
# process: a fault there cannot take the timed run's CUDA context); then times every
# variant beside the strongest graph-fused baseline at b1 / b8 / b4
# (benchmarks/megakernel_ab.py --variants attention: every list bitwise the tree's kernel,
# greedy tokens against eager) and runs the other gpu-marked tests of the persistent kernel
# and of the graph-fused engine's compile cache. carry [".site"]; results in $OUT.
# SET=silu (default attention, run 11) times RG_MK_SILU_AHEAD=4 / 8 instead (a down tile's
# SiLU-in staging, `--variants silu`), checked bit for bit by the same gpu test.
# SET=siludiag times the non-bitwise RG_MK_SILU_DIAG=1 / 2 diagnostics (`--variants
# siludiag`): the bit-for-bit test still checks the gated variants; only the traced down
# stage of the diagnostics is read.
# SET=siluout times the gate|up epilogue's SiLU (the builder's `silu_out` list, the tree's
# kernel: no extra cubin), checked bit for bit by the gpu test of SILU_OUT (both GEMV builds,
# b1/b4/b8, both schedules) instead of the build-variant test. SET=even times the
# builder's `even_splits` lists the same way (their gpu test: `-k even_splits`). SET=stack
# (run 20) times the one-trip merge, 16-byte norm loads and kv-head split waits on today's
# lists, alone and together (the build-variant test checks the bit-for-bit ones first);
# COMPILE=none CHUNKS=0 skip the max-autotune baseline (its fastest compiles are on record).
# SET=fat (runs 75-76; run 77 in issue19_pages.sh) times a few fat split tasks a kv head (the builder's `kv_splits`), on
# the tree's kernel, the 8-ahead build and RG_MK_SPLIT_PAGES=1 (with and without 8 ahead),
# checked first by their gpu test (`-k fat_splits`) and the builds' bit-for-bit test.
set -u
SET=${SET:-attention}
T0=$(date +%s)
. benchmarks/device_env.sh || exit 1
K=/tmp/k/cubins
[ -f "$K/mk_mmadiag2.cubin" ] || bash benchmarks/issue19_build.sh /tmp/k > /tmp/build.txt 2>&1 ||
  { tail -20 /tmp/build.txt; exit 1; }
if [ "$SET" = silu ]; then
  VAR=(mmasilu4="$K/mk_mmasilu4.cubin" mmasilu8="$K/mk_mmasilu8.cubin")
elif [ "$SET" = siludiag ]; then
  VAR=(mmasilud1="$K/mk_mmadiag1.cubin" mmasilud2="$K/mk_mmadiag2.cubin")
elif [ "$SET" = stack ]; then
  VAR=(mmam1="$K/mk_mmam1.cubin" nv="$K/mk_mmanv.cubin" nvm1="$K/mk_mmanvm1.cubin")
elif [ "$SET" = fat ]; then
  VAR=(mmasa8="$K/mk_mmasa8.cubin" mmapg="$K/mk_mmapg.cubin" mmasa8pg="$K/mk_mmasa8pg.cubin")
elif [ "$SET" = siluout ] || [ "$SET" = even ]; then
  VAR=()
else
  VAR=(mmasa8="$K/mk_mmasa8.cubin" mmam1="$K/mk_mmam1.cubin" mmase="$K/mk_mmase.cubin"
       mmaall="$K/mk_mmaall.cubin")
fi
grep -H "registers" "$K"/mk_mma*.cubin.log
echo "build took $(( $(date +%s) - T0 )) s"
CHECK=latency_variant
[ "$SET" = siluout ] && CHECK=silu_out
[ "$SET" = even ] && CHECK=even_splits
[ "$SET" = fat ] && CHECK="fat_splits or (latency_variant and pages)"
ROWGATE_NVCC="$(command -v nvcc)" timeout 240 python3 -m pytest -p no:cacheprovider -m gpu -q -rs \
  tests/megakernel/test_persistent_gpu.py -k "$CHECK" 2>&1 | tail -n 8 | tee "$OUT/pytest-variant.txt"
grep -q " passed" "$OUT/pytest-variant.txt" && ! grep -q "failed\|error" "$OUT/pytest-variant.txt" ||
  { echo "the variant is not the tree's kernel bit for bit: no timed run"; exit 1; }
echo "variant check took $(( $(date +%s) - T0 )) s"
rm -rf /tmp/runsa && mkdir -p /tmp/runsa
timeout 330 python3 benchmarks/megakernel_ab.py --out /tmp/runsa \
  --cubins mma="$K/mk_mma.cubin" mma9="$K/mk_mma.cubin" "${VAR[@]}" \
  --split-kv-cubin "$K/split_kv.sm_90.cubin" \
  --variants "$SET" --repeats 7 --budget-s 250 --batches 1 8 4 \
  --compile "${COMPILE:-max-autotune-no-cudagraphs}" --fused-chunks ${CHUNKS:-0 64} 2>&1 |
  grep -v "triton_mm\|AUTOTUNE\|strides:\|dtypes:\|Autotune\|best_kernel\|SingleProcess\|^  mm \|^  addmm\|TypedStorage\|current_out_size\|stage windows\|profile" | tail -n 45
cp /tmp/runsa/results.json "$OUT/results.json"
echo "ab took $(( $(date +%s) - T0 )) s"
ROWGATE_NVCC="$(command -v nvcc)" timeout $(( 585 - ($(date +%s) - T0) )) python3 -m pytest \
  -p no:cacheprovider -m gpu -q -rs tests/megakernel/test_persistent_gpu.py \
  tests/engines/test_fused_gpu.py -k "not latency_variant and not ($CHECK)" 2>&1 | tail -n 15 | tee "$OUT/pytest-gpu.txt"
echo "all took $(( $(date +%s) - T0 )) s"
