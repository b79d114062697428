#!/usr/bin/env bash
# The megakernel row sealed against the fastest of N baseline compiles, in two calls on
# one machine (the row itself fits one call: GATE_TIMEOUT=575 SKIP_TRACE=1 bash
# benchmarks/device_gate.sh KERNEL-CUDA-DECODE-MEGAKERNEL, one baseline compile): the
# second must start while the first's machine is still warm (what a call leaves there,
# rowgate's cache dir among it, is kept for the next). Run from
# the checkout's root:
#   bash lab/benchmarks/megakernel_seal.sh warm   # carry [".site"]
#     the final kernel's ncu counters at batch 1 (lab/benchmarks/megakernel_ncu.py, the
#     builder's default b1 list), then the graph-fused baseline compiled at every batch of
#     the row, the fastest of up to COMPILES (default 3) compiles that fit the call
#     (lab/benchmarks/fused_warm.py: its max-autotune choices left in torchinductor/ of
#     rowgate's cache dir, what each compile costs and how fast each ran);
#     $OUT/warm.tar.gz. GPU_TESTS="EXPR"
#     runs the persistent kernel's gpu tests picked by `-k EXPR` between the two (at most
#     GPU_TESTS_TIMEOUT s, default 150; log pytest-gpu-persistent.txt)
#   bash lab/benchmarks/megakernel_seal.sh seal   # carry [".site"], right after `warm`
#     `rowgate gate KERNEL-CUDA-DECODE-MEGAKERNEL` through benchmarks/device_gate.sh
#     (the bundle in $OUT/evidence.tar.gz.part-*); the trace and throughput gates compile
#     from the warm cache, so the trace and the A/B run the kernels `warm` timed.
# On a runner without the 10-minute cap the row is one `nox -s gate-megakernel`.
# The row's bars are the H200's: either step exits 3 at once on another card (the pool may
# give an H100 for a call that names nvidia-h200), NEED_GPU=NAME to seal on another
# (NEED_GPU=NVIDIA takes any card: the row was sealed on an H100 so once, docs/perf.md).
# Carry: the full .site and the tree are over the 64 MiB a call carries; leave the bundle
# this seal replaces out of the working tree for both calls (docs/perf.md, "The raw split
# loop as the default").
set -uo pipefail
ROW=KERNEL-CUDA-DECODE-MEGAKERNEL
T0=$(date +%s)
case "${1:-}" in warm|seal) ;; *) echo "usage: $0 warm|seal" >&2; exit 2 ;; esac
card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case "$card" in
  *"${NEED_GPU:-H200}"*) echo "card: $card" ;;
  *) echo "not an ${NEED_GPU:-H200} ($card): nothing run" >&2; exit 3 ;;
esac
# persistent_gpu_tests SECONDS EXPR LOG: the persistent kernel's gpu tests picked by
# `-k EXPR`, at most SECONDS, on the build gate's own build of the tree; the summary's
# last lines to LOG.
persistent_gpu_tests() {
  ROWGATE_NVCC="$(command -v nvcc)" timeout "$1" \
    python3 -m pytest -p no:cacheprovider --noconftest -m gpu -q -rs \
    lab/tests/megakernel/test_persistent_gpu.py -k "$2" 2>&1 | tail -n 8 | tee "$3"
}
case "${1:-}" in
  warm)
    R=/tmp/warm-results
    rm -rf "$R" /tmp/k && mkdir -p "$R"
    . benchmarks/device_env.sh || exit 1
    # the tree's tensor-core kernel (kernels.toml persistent_decode_mma), the build gate's flags
    mkdir -p /tmp/k/cubins
    nvcc -cubin -arch=sm_90 -std=c++17 -I lab/kernels/include -Werror all-warnings \
      -Xptxas -v,-warn-spills,-warn-lmem-usage -Xcompiler -Wall,-Wextra,-Werror \
      -DRG_MK_MMA=1 -DRG_MK_STREAM=1 -o /tmp/k/cubins/mk_mma.cubin lab/kernels/persistent/megakernel.cu \
      > /tmp/k/cubins/mk_mma.cubin.log 2>&1 || { tail -20 /tmp/k/cubins/mk_mma.cubin.log; exit 1; }
    grep -h "registers" /tmp/k/cubins/mk_mma.cubin.log | head -3
    timeout 200 python3 lab/benchmarks/megakernel_ncu.py --out "$R/ncu" --norm-in --batch 1 \
      --cubin mma=/tmp/k/cubins/mk_mma.cubin 2>&1 | tail -n 30
    echo "ncu took $(( $(date +%s) - T0 )) s"
    if [ -n "${GPU_TESTS:-}" ]; then  # the persistent kernel's gpu tests on the final kernel,
      # in this call when the session's device time does not hold a third (-k GPU_TESTS)
      persistent_gpu_tests "${GPU_TESTS_TIMEOUT:-150}" "$GPU_TESTS" "$R/pytest-gpu-persistent.txt"
      echo "gpu tests took $(( $(date +%s) - T0 )) s"
    fi
    LEFT=$(( 560 - ($(date +%s) - T0) ))
    timeout "$LEFT" python3 lab/benchmarks/fused_warm.py "$ROW" --compiles "${COMPILES:-3}" \
      --budget-s $(( LEFT - 20 )) --option nvcc="$(command -v nvcc)" --out "$R" 2>&1 |
      grep -v "triton_mm\|AUTOTUNE\|strides:\|dtypes:\|Autotune\|best_kernel\|SingleProcess\|^  mm \|^  addmm"
    du -sh "$(python3 -c 'from rowgate.engines import INDUCTOR_CACHE; print(INDUCTOR_CACHE)')" 2>/dev/null
    # the compiles that lost keep their caches under compiles/N/cache (~160 MB): left out,
    # or the tarball is over what a call returns (one that held them did not come back)
    tar czf "$OUT/warm.tar.gz" --exclude=cache -C "$R" .
    ;;
  seal)
    SKIP_TRACE=1 GATE_TIMEOUT=${GATE_TIMEOUT:-560} bash benchmarks/device_gate.sh "$ROW" 2>&1 |
      grep -v "triton_mm\|AUTOTUNE\|strides:\|dtypes:\|Autotune\|best_kernel\|SingleProcess\|^  mm \|^  addmm" |
      tail -n 70
    ;;
esac
echo "all took $(( $(date +%s) - T0 )) s"
