#!/bin/bash
# Start-up probe on the GPU machine: process start costs, the cold/warm matrix with timelines, then a
# cProfile of a warm llama-1b start. Usage: bash bench/gpu_probe_startup.sh   (logs under $OUT)
# FIRST_USE=1 also runs bench/gpu_first_use.py (first matmul/SDPA/capture costs in a fresh process).
set -o pipefail
export PYTHONUNBUFFERED=1
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/sp_pycache}
OUT=${OUT:-/tmp}
[ -n "$FIRST_USE" ] && python3 bench/gpu_first_use.py 2>&1 | tee $OUT/first_use.log
for i in 1 2 3; do
  /usr/bin/time -f "python -c pass %e s" python3 -c pass
  /usr/bin/time -f "python -S -c pass %e s" python3 -S -c pass
  /usr/bin/time -f "python -c 'import triton' %e s" python3 -c "import triton"
done 2>&1
TIMELINE=1 OUT=$OUT bash bench/gpu_startup_matrix.sh
C=$(mktemp -d /tmp/spc_probe.XXXX)
SHAPEPLAN_CACHE_DIR=$C timeout 90 python3 bench/gpu_startup.py --label prime > /dev/null 2>&1
SHAPEPLAN_CACHE_DIR=$C timeout 90 python3 bench/gpu_startup.py --label warm_profile --cprofile 70 > $OUT/warm_profile.log 2>&1
tail -1 $OUT/warm_profile.log
for f in $OUT/startup_*.log $OUT/blocks_*.log; do echo "== $f"; grep -E " ms  " $f | head -80; done
