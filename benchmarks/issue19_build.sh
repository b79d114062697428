#!/usr/bin/env bash
# The cubins benchmarks/issue19_device.sh runs, built here with the build gate's nvcc
# flags (pipeline/build/cudabuild.py: warnings as errors, ptxas -v, no spills or local
# memory) for sm_90, into DIR/cubins (default .devrun/kernels/cubins):
#   split_kv.sm_90.cubin   every split_kv entry point (base, pipe, bulk, bulkc)
#   mk_v2.cubin            the persistent kernel as the build gate builds it (the ring)
#   mk_ring0.cubin         RG_MK_RING=0 (v1's register-load GEMV)
#   mk_claim.cubin         RG_MK_CLAIM_AHEAD=1 (the dynamic queue claims ahead)
#   mk_next.cubin          RG_MK_NEXT_L2=1 (static: the next task's weights into L2)
#   mk_mma.cubin           RG_MK_MMA=1 RG_MK_STREAM=1, the tree's kernel (tensor-core GEMV tiles,
#                          kernels/persistent/gemv_mma.cuh; the raw split loop, RG_MK_SPLIT_RAW=4,
#                          since 9e8d231; the ring one stream across tasks since run 87). The
#                          other mk_mma* builds below are the plain ring's (RG_MK_MMA=1 and theirs)
#   mk_mmaplain.cubin      RG_MK_MMA=1 alone: the plain ring, the tree's kernel before run 87
#   mk_mmal2.cubin         RG_MK_MMA=1 RG_MK_TILE_L2=1 (a task's whole tile into L2 before its wait)
#   mk_mmanext.cubin       RG_MK_MMA=1 RG_MK_NEXT_L2=1 (static: the next task's tile into L2)
#   mk_mmadeep.cubin       RG_MK_MMA=1 RG_MK_DEEP=1 (a 5-group ring where the input fits 32 KB)
#   mk_mmanv.cubin         RG_MK_MMA=1 RG_MK_NORM_VEC=1 (16-byte norm loads)
#   mk_mmanvm1.cubin       RG_MK_MMA=1 RG_MK_NORM_VEC=1 RG_MK_MERGE_ONE_TRIP=1 (run 20's stack)
#   mk_mmasa8.cubin        RG_MK_MMA=1 RG_MK_SPLIT_AHEAD=8 (a split warp's next 8 tokens in flight)
#   mk_mmapg.cubin         RG_MK_MMA=1 RG_MK_SPLIT_PAGES=1 (a split's pages read once, two a lane)
#   mk_mmasa8pg.cubin      RG_MK_MMA=1 RG_MK_SPLIT_AHEAD=8 RG_MK_SPLIT_PAGES=1
#   mk_mmaraw0.cubin       RG_MK_MMA=1 RG_MK_SPLIT_RAW=0 (the one-token-ahead split loop, the
#                          default until run 79: mk_mma in every run before 81)
#   mk_mmaraw2/4/8.cubin   RG_MK_MMA=1 RG_MK_SPLIT_RAW=2/4/8 (a split loop templated on the
#                          group, its next 2/4/8 tokens' rows held raw: run 79)
#   mk_mmaraw4l2.cubin     ... and RG_MK_SPLIT_L2=1 (a split's K/V rows asked of L2 before
#                          its counter wait: the next device call, SET=rawl2 issue19_raw.sh)
#   mk_mmam1.cubin         RG_MK_MMA=1 RG_MK_MERGE_ONE_TRIP=1 (a merge's loads in one round trip)
#   mk_mmase.cubin         RG_MK_MMA=1 RG_MK_SKIP_EMPTY=1 (an empty split runs without waiting)
#   mk_mmaall.cubin        RG_MK_MMA=1 and all three
#   mk_mmastream.cubin     RG_MK_MMA=1 RG_MK_STREAM=1 RG_MK_STREAM_AHEAD=1 (the ring runs on into the
#                          next GEMV task on the static schedule: its first groups in flight across
#                          the barrier; runs 86-87)
#   mk_mmastreamt.cubin    ... and RG_MK_STREAM_TAIL=1 (into the next task only once this one's
#                          groups are all read; run 87)
#   mk_mmasilu4.cubin      RG_MK_MMA=1 RG_MK_SILU_AHEAD=4 (a SiLU-in staging's 4 granules in flight)
#   mk_mmasilu8.cubin      RG_MK_MMA=1 RG_MK_SILU_AHEAD=8
#   mk_mmadiag1.cubin      RG_MK_MMA=1 RG_MK_SILU_DIAG=1 (diagnostic, not bitwise: fast-intrinsic SiLU)
#   mk_mmadiag2.cubin      RG_MK_MMA=1 RG_MK_SILU_DIAG=2 (diagnostic, not bitwise: no SiLU)
# Each NAME.log keeps ptxas -v (registers, spills); mk_mma.sass the SASS where cuobjdump
# is found (CUOBJDUMP=path, else PATH, else a venv's nvidia-cu13 wheel).
# Usage: bash benchmarks/issue19_build.sh [DIR] (NVCC=path to pick the compiler; ONLY="mk_mma
# mk_mmapg ..." builds only the cubins named, without .cubin; EXTRA="-lineinfo" adds nvcc flags).
set -euo pipefail
OUT=${1:-.devrun/kernels}/cubins
NVCC=${NVCC:-nvcc}
mkdir -p "$OUT"
flags=(-cubin -arch=sm_90 -std=c++17 -I kernels/include -Werror all-warnings
       -Xptxas -v,-warn-spills,-warn-lmem-usage -Xcompiler -Wall,-Wextra,-Werror)
read -r -a extra <<< "${EXTRA:-}"
build() {  # out source [defines...]
  local out=$1 src=$2
  shift 2
  [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" ${out%.cubin} "* ]] || return 0
  "$NVCC" "${flags[@]}" "${extra[@]}" "$@" -o "$OUT/$out" "$src" > "$OUT/$out.log" 2>&1 ||
    { cat "$OUT/$out.log"; exit 1; }
}
pids=()
build split_kv.sm_90.cubin kernels/decode_attention/split_kv.cu & pids+=($!)
build mk_v2.cubin kernels/persistent/megakernel.cu & pids+=($!)
build mk_ring0.cubin kernels/persistent/megakernel.cu -DRG_MK_RING=0 & pids+=($!)
build mk_claim.cubin kernels/persistent/megakernel.cu -DRG_MK_CLAIM_AHEAD=1 & pids+=($!)
build mk_next.cubin kernels/persistent/megakernel.cu -DRG_MK_NEXT_L2=1 & pids+=($!)
build mk_mma.cubin kernels/persistent/megakernel.cu -DRG_MK_MMA=1 -DRG_MK_STREAM=1 & pids+=($!)
build mk_mmaplain.cubin kernels/persistent/megakernel.cu -DRG_MK_MMA=1 & pids+=($!)
build mk_mmal2.cubin kernels/persistent/megakernel.cu -DRG_MK_MMA=1 -DRG_MK_TILE_L2=1 & pids+=($!)
build mk_mmanext.cubin kernels/persistent/megakernel.cu -DRG_MK_MMA=1 -DRG_MK_NEXT_L2=1 & pids+=($!)
build mk_mmadeep.cubin kernels/persistent/megakernel.cu -DRG_MK_MMA=1 -DRG_MK_DEEP=1 & pids+=($!)
build mk_mmanv.cubin kernels/persistent/megakernel.cu -DRG_MK_MMA=1 -DRG_MK_NORM_VEC=1 & pids+=($!)
build mk_mmanvm1.cubin kernels/persistent/megakernel.cu -DRG_MK_MMA=1 -DRG_MK_NORM_VEC=1 \
  -DRG_MK_MERGE_ONE_TRIP=1 & pids+=($!)
build mk_mmasa8.cubin kernels/persistent/megakernel.cu -DRG_MK_MMA=1 -DRG_MK_SPLIT_AHEAD=8 & pids+=($!)
build mk_mmapg.cubin kernels/persistent/megakernel.cu -DRG_MK_MMA=1 -DRG_MK_SPLIT_PAGES=1 & pids+=($!)
build mk_mmaraw4l2.cubin kernels/persistent/megakernel.cu -DRG_MK_MMA=1 -DRG_MK_SPLIT_RAW=4 \
  -DRG_MK_SPLIT_L2=1 & pids+=($!)
for r in 0 2 4 8; do
  build mk_mmaraw$r.cubin kernels/persistent/megakernel.cu -DRG_MK_MMA=1 -DRG_MK_SPLIT_RAW=$r &
  pids+=($!)
done
build mk_mmasa8pg.cubin kernels/persistent/megakernel.cu -DRG_MK_MMA=1 -DRG_MK_SPLIT_AHEAD=8 \
  -DRG_MK_SPLIT_PAGES=1 & pids+=($!)
build mk_mmam1.cubin kernels/persistent/megakernel.cu -DRG_MK_MMA=1 -DRG_MK_MERGE_ONE_TRIP=1 & pids+=($!)
build mk_mmase.cubin kernels/persistent/megakernel.cu -DRG_MK_MMA=1 -DRG_MK_SKIP_EMPTY=1 & pids+=($!)
build mk_mmasilu4.cubin kernels/persistent/megakernel.cu -DRG_MK_MMA=1 -DRG_MK_SILU_AHEAD=4 & pids+=($!)
build mk_mmasilu8.cubin kernels/persistent/megakernel.cu -DRG_MK_MMA=1 -DRG_MK_SILU_AHEAD=8 & pids+=($!)
build mk_mmadiag1.cubin kernels/persistent/megakernel.cu -DRG_MK_MMA=1 -DRG_MK_SILU_DIAG=1 & pids+=($!)
build mk_mmadiag2.cubin kernels/persistent/megakernel.cu -DRG_MK_MMA=1 -DRG_MK_SILU_DIAG=2 & pids+=($!)
build mk_mmaall.cubin kernels/persistent/megakernel.cu -DRG_MK_MMA=1 -DRG_MK_SPLIT_AHEAD=8 \
  -DRG_MK_MERGE_ONE_TRIP=1 -DRG_MK_SKIP_EMPTY=1 & pids+=($!)
build mk_mmastream.cubin kernels/persistent/megakernel.cu -DRG_MK_MMA=1 -DRG_MK_STREAM=1 \
  -DRG_MK_STREAM_AHEAD=1 & pids+=($!)
build mk_mmastreamt.cubin kernels/persistent/megakernel.cu -DRG_MK_MMA=1 -DRG_MK_STREAM=1 \
  -DRG_MK_STREAM_AHEAD=1 -DRG_MK_STREAM_TAIL=1 & pids+=($!)
for p in "${pids[@]}"; do wait "$p" || exit 1; done
CUOBJDUMP=${CUOBJDUMP:-$(command -v cuobjdump ||
  ls .nox/tests/lib/python3*/site-packages/nvidia/cu13/bin/cuobjdump 2>/dev/null | head -1 || true)}
if [ -n "$CUOBJDUMP" ] && [ -f "$OUT/mk_mma.cubin" ]; then
  "$CUOBJDUMP" -sass "$OUT/mk_mma.cubin" > "$OUT/mk_mma.sass"
  echo "mk_mma.cubin SASS: $(grep -c HMMA "$OUT/mk_mma.sass") HMMA, $(grep -c LDSM "$OUT/mk_mma.sass") LDSM"
fi
grep -H "registers\|spill" "$OUT"/mk_*.log
"$NVCC" --version | tail -1 > "$OUT/nvcc-version.txt"
ls -la "$OUT"
