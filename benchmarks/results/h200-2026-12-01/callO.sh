#!/bin/bash
# Device call O (issue 18): the SM70 row's gate on the sm_90 stand-in and the external
# subject pagedmini re-sealed in the compact format, then the gpu-marked tests not run on
# the merged tree yet (the subject contract's, the persistent engine's); carry [".whl"].
set -u
T0=$(date +%s)
mkdir -p "$OUT/sm70" "$OUT/pagedmini"
OUT=$OUT/sm70 SKIP_TRACE=1 GATE_TIMEOUT=200 bash benchmarks/device_gate.sh SM70-XQA-E5M2-DECODE 2>&1 | tail -n 40
echo "sm70 took $(( $(date +%s) - T0 )) s"
OUT=$OUT/pagedmini ONLY=pagedmini GPU_TESTS=1 SCRIPT_TIMEOUT=250 GPU_TESTS_TIMEOUT=150 \
  bash benchmarks/subject_gates.sh 2>&1 | tail -n 30
echo "pagedmini took $(( $(date +%s) - T0 )) s"
export PYTHONPATH="/tmp/site:$PWD"
ROWGATE_NVCC="$(command -v nvcc)" timeout 120 python3 -m pytest -p no:cacheprovider -m gpu -q -rs \
  tests/megakernel/test_persistent_gpu.py 2>&1 | tail -n 15 | tee "$OUT/pytest-persistent-gpu.txt"
echo "all took $(( $(date +%s) - T0 )) s"
