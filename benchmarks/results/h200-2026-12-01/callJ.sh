#!/bin/bash
# Device call J: issue 17 calibration (probe A/A to 20 runs, planted 5 % and 2 %), then
# issue 18: DEMO-GPU-DECODE sealed twice (two H200 bundles of one row for compare/history).
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
mkdir -p /tmp/cal
timeout 400 python3 benchmarks/calibrate_throughput.py cuda --budget-s 370 --phases probe-qwen3-h2048-l16/0:4 tiny-qwen3/0.05 tiny-qwen3/0.02 --out /tmp/cal > /tmp/cal/log.txt 2>&1; echo "calibrate rc=$?" >> /tmp/cal/log.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader >> /tmp/cal/log.txt
cp /tmp/cal/calibration.json $OUT/cal.json; cp /tmp/cal/log.txt $OUT/cal-log.txt
tar czf $OUT/cal.tar.gz -C /tmp/cal .
tail -n 12 $OUT/cal-log.txt
echo "calibration took $(( $(date +%s) - T0 )) s"
SKIP_TRACE=1 GATE_TIMEOUT=120 bash benchmarks/device_gate.sh DEMO-GPU-DECODE DEMO-GPU-DECODE 2>&1 | tail -n 40
echo "all took $(( $(date +%s) - T0 )) s"
