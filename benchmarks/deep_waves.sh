#!/usr/bin/env bash
# One device call (issue 19, item 3): benchmarks/deep_waves.py on split_kv.cu's default
# build (made here with the device's nvcc, warnings as errors): the deep candidate and cuDNN
# SDPA at 16K tokens, batches 4-99, for the fixed cost a launch against the streaming rate;
# with --flush-ab, B16 only after the write flush and after a read flush (flush_ab.json).
# No carry; ~1-4 minutes. Results: $OUT/waves.tar.gz (every sample).
set -u
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
R=/tmp/deep-waves && rm -rf "$R" && mkdir -p "$R"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu \
    --format=csv; nvcc --version | tail -1; git rev-parse HEAD 2>/dev/null; } | tee "$R/env.txt"
python3 - "$R/split_kv.cubin" <<'PY' || exit 1
import shutil, subprocess, sys
from pathlib import Path
from benchmarks.decode_attention import nvcc_cmd
subprocess.run(nvcc_cmd(shutil.which("nvcc"), "sm_90", Path(sys.argv[1]), []), check=True,
               capture_output=True)
PY
timeout "${WAVES_TIMEOUT:-400}" python3 benchmarks/deep_waves.py --cubin "$R/split_kv.cubin" \
  --out "$R" --repeats "${REPEATS:-15}" "$@" 2>&1 | tee "$R/waves.log" | tail -n 30
rm -f "$R/split_kv.cubin"
tar czf "$OUT/waves.tar.gz" -C "$R" .
echo "total $(( $(date +%s) - T0 )) s"
