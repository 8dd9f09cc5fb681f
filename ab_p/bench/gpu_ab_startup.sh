#!/bin/bash
# Same-machine A/B of start-up: an older tree (extracted into ab_base/: `git archive <rev> shapeplan bench
# | tar -x -C ab_base`) against this one, runs interleaved (cold, then three warm, llama-1b pipeline; then
# the block stack cold and warm), after one torch process has loaded the CUDA libraries (OS file cache).
# Usage on the GPU machine: bash bench/gpu_ab_startup.sh   (lent machines differ more than the changes do)
export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/sp_pycache
python3 -m compileall -q shapeplan bench ab_base > /dev/null
python3 -m compileall -q /opt/torch/.venv/lib/python3.12/site-packages/triton > /dev/null
python3 bench/gpu_first_use.py > /dev/null 2>&1
C=$(mktemp -d)
for l in cold warm1 warm2 warm3; do
  for t in ab_base final; do
    [ $t = final ] && d=. || d=ab_base
    SHAPEPLAN_CACHE_DIR=$C/$t/llama timeout 90 python3 $d/bench/gpu_startup.py --label "$t $l" 2>&1 | tail -1 | cut -c1-125
  done
done
for l in cold warm; do
  for t in ab_base final; do
    [ $t = final ] && d=. || d=ab_base
    SHAPEPLAN_CACHE_DIR=$C/$t/blocks timeout 120 python3 $d/bench/gpu_blocks.py --shapes 1x1 --no-compile --optimize --iters 20 2>/dev/null | grep -E "^ +1x1 triton" | sed "s|^|$t blocks $l: |"
  done
done
