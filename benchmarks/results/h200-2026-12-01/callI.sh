#!/bin/bash
# Device call I: issue 17 calibration at the interleaved schedule: tiny and probe A/A, 20 runs each.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
mkdir -p /tmp/cal
timeout 575 python3 benchmarks/calibrate_throughput.py cuda --budget-s ${BUDGET:-540} --phases ${PHASES} --out /tmp/cal > /tmp/cal/log.txt 2>&1; echo "calibrate rc=$?" >> /tmp/cal/log.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader >> /tmp/cal/log.txt
cp /tmp/cal/calibration.json /tmp/cal/calibration.txt /tmp/cal/log.txt $OUT/
tar czf $OUT/calibration.tar.gz -C /tmp/cal .
tail -n 30 $OUT/log.txt
