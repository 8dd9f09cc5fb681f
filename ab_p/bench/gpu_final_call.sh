#!/bin/bash
# The session's last device call: bench/gpu_final.sh (GPU tests, block stack, llama-1b decode, start-up
# matrix with timelines, REPEAT more cold/warm starts), llama-8b decode (triton), and where a compile
# worker's Triton import goes (-X importtime, largest own times). Keeps at most 8 logs under $OUT (the
# device tool returns no more). Usage on the GPU machine: OUT=/some/dir bash bench/gpu_final_call.sh
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/sp_pycache}
R=${OUT:-/tmp/final_call}; W=/tmp/final_work; mkdir -p $R $W
P=$(python3 -c 'import sys; print(":".join(p for p in sys.path if p))')
(TIMELINE=1 STARTUP=1 REPEAT=${REPEAT:-2} OUT=$W bash bench/gpu_final.sh) > $R/final.log 2>&1
timeout 200 python3 bench/gpu_decode.py --presets llama-8b --configs triton > $R/decode8b.log 2>&1
echo "== worker-style Triton import (python -S), largest own times in us" >> $R/final.log
PROBE_PATH=$P python3 -S -X importtime -c "import os, sys; sys.path += os.environ['PROBE_PATH'].split(':'); import triton" 2>&1 \
  | awk -F'|' '/import time:/ {gsub(/import time: */, "", $1); print $1 + 0, $2 + 0, $3}' | sort -n -r | head -12 >> $R/final.log
for f in tests.log blocks.log decode1b.log startup_cold.log startup_warm.log blocks_cold.log; do cp $W/$f $R/ 2>/dev/null; done
grep -E "passed|failed" $R/tests.log | tail -2
grep -E "triton|cuda_graphs|slot_by_slot" $R/blocks.log | tail -3
grep -E "^(triton|cuda_graphs) " $R/decode1b.log; grep -E "^triton " $R/decode8b.log | sed 's/^/8b /'
grep -E '^\{|blocks (cold|warm|cold_again):|^ +1x1 (cuda_graphs|triton)|repeat' $R/final.log | cut -c1-220
tail -13 $R/final.log
