#!/usr/bin/env bash
# One device call: the GPU-marked tests (the core's, then the lab's) and the sandbox's
# cost on GPU work, with rowgate installed from its wheel (benchmarks/device_env.sh).
# Run from the repo root with `.site` carried (benchmarks/device_site.sh):
#   bash benchmarks/device_gpu.sh [core|lab|overhead|operator-overhead|throughput-overhead ...]
#   (default: core lab overhead)
# Writes $OUT/env.txt, $OUT/pytest-gpu-core.txt, $OUT/pytest-gpu-lab.txt,
# $OUT/sandbox-overhead.json and, for operator-overhead, sandbox-overhead-operator.json,
# the two gates' logs and their sealed bundles (overhead-operator-evidence.tar.gz), for
# throughput-overhead sandbox-overhead-throughput.json and the two servers' logs;
# TESTS_TIMEOUT (default 240 s) bounds each test set, OVERHEAD_TIMEOUT (default 300 s) the
# throughput A/A, OVERHEAD_BUDGET (seconds, default 0: all ROUNDS) when it starts no more
# rounds, LISTEN (socket|port, default socket) where its servers listen.
set -uo pipefail
. benchmarks/device_env.sh || exit 1
parts=("${@:-core lab overhead}")
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,driver_version --format=csv
  nvcc --version | tail -2; bwrap --version; python3 -c "import rowgate, rowgate_lab; print(rowgate.__file__, rowgate_lab.__file__)"
} 2>&1 | tee "$OUT/env.txt"
export ROWGATE_NVCC="$(command -v nvcc)" XDG_CONFIG_HOME=/tmp/rowgate-config ROWGATE_SIGNER=key
for part in ${parts[*]}; do
  case "$part" in
    core) timeout "${TESTS_TIMEOUT:-240}" python3 -m pytest -p no:cacheprovider -m gpu -q -rs \
            --durations=10 tests 2>&1 | tail -n 40 | tee "$OUT/pytest-gpu-core.txt" ;;
    lab) timeout "${TESTS_TIMEOUT:-240}" python3 -m pytest -p no:cacheprovider -m gpu -q -rs \
           --durations=10 lab/tests 2>&1 | tail -n 40 | tee "$OUT/pytest-gpu-lab.txt" ;;
    overhead) timeout 240 python3 benchmarks/sandbox_overhead.py --out "$OUT" --rounds "${ROUNDS:-16}" ;;
    operator-overhead)
      PYTHONPATH=".:$PYTHONPATH" timeout 420 python3 benchmarks/sandbox_overhead.py \
        --workload operator --out /tmp/overhead-operator --rounds "${ROUNDS:-16}" --nvcc "$ROWGATE_NVCC"
      cp /tmp/overhead-operator/sandbox-overhead-operator.json /tmp/overhead-operator/gate-log-* "$OUT/"
      tar czf "$OUT/overhead-operator-evidence.tar.gz" -C /tmp/overhead-operator evidence ;;
    throughput-overhead)
      PYTHONPATH=".:$PYTHONPATH" timeout "${OVERHEAD_TIMEOUT:-300}" python3 benchmarks/sandbox_overhead.py \
        --workload throughput --out /tmp/overhead-throughput --rounds "${ROUNDS:-16}" \
        --passes "${PASSES:-1}" --listen "${LISTEN:-socket}" --budget-s "${OVERHEAD_BUDGET:-0}"
      cp /tmp/overhead-throughput/sandbox-overhead-throughput.json "$OUT/" ;;
    *) echo "unknown part $part" >&2; exit 2 ;;
  esac
done
