#!/bin/bash
# Device call K: issue 17 planted 2 % to 20 runs.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
rm -rf /tmp/cal; mkdir -p /tmp/cal
timeout ${LIMIT:-380} python3 benchmarks/calibrate_throughput.py cuda --budget-s ${BUDGET:-350} --phases tiny-qwen3/0.02:${RUNS:-16} --out /tmp/cal > /tmp/cal/log.txt 2>&1; echo "calibrate rc=$?" >> /tmp/cal/log.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader >> /tmp/cal/log.txt
cp /tmp/cal/calibration.json $OUT/cal.json; cp /tmp/cal/log.txt $OUT/cal-log.txt
tar czf $OUT/cal.tar.gz -C /tmp/cal .
tail -n 24 $OUT/cal-log.txt
