#!/bin/bash
# Device call M (issue 19, run 4): the persistent kernel's stage waits overlapped with the
# weight stream (benchmarks/megakernel_ab.py --variants l2: RG_MK_TILE_L2, RG_MK_NEXT_L2 on
# the tensor-core GEMV, fine_deps) against the strong graph-fused baseline, then ncu on the
# b1 step of the tensor-core GEMV with and without the tile prefetch. Cubins built here by
# `bash benchmarks/issue19_build.sh .devrun/k20`; carry [".devrun/k20"] (its whl/: .whl less plotly, for the 64 MiB limit).
set -u
T0=$(date +%s)
C=.devrun/k20/cubins
PARTS=mk MK_TIMEOUT=400 CUBINS=$C WHL=.devrun/k20/whl MK_VARIANTS=l2 MK_BUDGET=300 MK_REPEATS=7 \
  bash benchmarks/issue19_device.sh 2>&1 | tail -n 60
echo "megakernel A/B took $(( $(date +%s) - T0 )) s"
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
rm -rf /tmp/mkncu && mkdir -p /tmp/mkncu
timeout 150 python3 benchmarks/megakernel_ncu.py --out /tmp/mkncu --batch 1 \
  --cubin mma=$C/mk_mma.cubin --cubin mmal2=$C/mk_mmal2.cubin 2>&1 | tail -n 8
tar czf "$OUT/ncu.tar.gz" -C /tmp/mkncu .
echo "all took $(( $(date +%s) - T0 )) s"
