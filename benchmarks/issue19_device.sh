#!/usr/bin/env bash
# Issue 19 in one device call (docs/perf.md, "Issue 19"): the split_kv bulk candidate
# against its baseline (bitwise on the operator gate's case matrix, fp64, B16x16K / B1x1K
# timing, ncu) and the persistent kernel's variants against the strong graph-fused
# baseline (benchmarks/megakernel_ab.py). Run from a directory holding this checkout's
# pipeline/, kernels/, benchmarks/, rows/, the cubins it names (built beforehand with the
# build gate's flags: benchmarks/issue19_build.sh) and whl/ (pydantic and its
# dependencies, which the device image lacks). Results: $OUT/results.tar.gz.
# Environment: CUBINS (default cubins), WHL (default whl), PARTS (default "attn mk ncu
# pytest"; "mk" alone is the megakernel A/B, at most MK_TIMEOUT = 180 s), MK_VARIANTS
# (mma, the default: the tensor-core GEMV beside the current default; issue19: runs 1-2).
set -uo pipefail
R=/tmp/issue19 && rm -rf "$R" && mkdir -p "$R"
C=${CUBINS:-cubins}
PARTS=" ${PARTS:-attn mk ncu pytest} "
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  "${WHL:-whl}"/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu \
    --format=csv; nvcc --version | tail -1; git rev-parse HEAD 2>/dev/null; cat COMMIT; } \
  > "$R/env.txt" 2>&1
SPLIT=$C/split_kv.sm_90.cubin
if [[ $PARTS == *" attn "* ]]; then
  timeout "${ATTN_TIMEOUT:-110}" python3 benchmarks/decode_attention.py --out "$R/attn" \
    --cubin "$SPLIT" --candidate e5m2_bulk --skip ncu --repeats 15 2>&1 | tee "$R/attn.log"
fi
if [[ $PARTS == *" mk "* ]]; then
  cub=()
  for n in v2 ring0 claim next mma mmal2 mmanext; do [ -f "$C/mk_$n.cubin" ] && cub+=("$n=$C/mk_$n.cubin"); done
  t0=$(date +%s)
  timeout "${MK_TIMEOUT:-180}" python3 benchmarks/megakernel_ab.py --out "$R/mk" \
    --cubins "${cub[@]}" --split-kv-cubin "$SPLIT" --variants "${MK_VARIANTS:-mma}" \
    --repeats "${MK_REPEATS:-7}" --budget-s "${MK_BUDGET:-115}" 2>&1 | tee "$R/mk.log"
  echo "megakernel part: $(( $(date +%s) - t0 )) s" | tee -a "$R/mk.log"
fi
if [[ $PARTS == *" ncu "* ]]; then
  timeout "${NCU_TIMEOUT:-60}" python3 benchmarks/decode_attention.py --out "$R/ncu" \
    --cubin "$SPLIT" --skip smoke --skip bench_large --skip bench_small --skip operator \
    --skip operator_bf16 --skip operator_g2 2>&1 | tail -5 | tee "$R/ncu.log"
fi
if [[ $PARTS == *" pytest "* ]]; then
  # the persistent kernel through the engine (both schedules, fallback, traced launches)
  ROWGATE_PERSISTENT_CUBIN=$C/mk_v2.cubin timeout "${TESTS_TIMEOUT:-60}" python3 -m pytest \
    --noconftest -p no:cacheprovider -q -m gpu tests/megakernel/test_persistent_gpu.py \
    2>&1 | tail -15 | tee "$R/pytest-gpu.txt"
fi
tar czf "$OUT/results.tar.gz" -C "$R" .
ls -la "$OUT"
