#!/usr/bin/env bash
# compute-sanitizer's memcheck and racecheck on the deep kernels of CUBIN, run by
# benchmarks/deep_sanitize.py on its shapes, each tool's report into
# OUTDIR/<tool><SUFFIX>.txt and one line a tool on stdout.
#   bash benchmarks/deep_sanitize.sh CUBIN OUTDIR [SUFFIX [deep_sanitize.py args...]]
# SAN_TIMEOUT (120) bounds each tool. Used by issue19_deep.sh and deep_pick.sh.
set -u
cubin=$1 out=$2 suffix=${3:-}
shift $(( $# < 3 ? $# : 3 ))
command -v compute-sanitizer >/dev/null || { echo "no compute-sanitizer: not run"; exit 0; }
for tool in memcheck racecheck; do
  log="$out/$tool$suffix.txt"
  timeout "${SAN_TIMEOUT:-120}" compute-sanitizer --tool "$tool" --kernel-name kns=_deep \
    --report-api-errors no --print-limit 20 python3 benchmarks/deep_sanitize.py \
    --cubin "$cubin" "$@" > "$log" 2>&1
  echo "$tool$suffix rc=$?: $(grep -c 'bitwise True' "$log") shapes bitwise"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|bitwise False|Error" "$log" | head -n 6
done
