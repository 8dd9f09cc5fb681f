#!/bin/bash
# Fifth session: the CUDA warm-up's parts on 4 threads vs 1 (fresh processes, interleaved), then the
# llama-1b warm start with each (frozen-plan records present). Logs under $OUT.
export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/sp_pycache
O=${OUT:-/tmp}
python3 -m compileall -q shapeplan bench > /dev/null
python3 -c "import torch; torch.ones(1, device='cuda') @ torch.ones(1, 1, device='cuda')" > /dev/null
for n in 1 4 1 4; do SHAPEPLAN_CUDA_WARM_THREADS=$n python3 bench/gpu_warm_threads.py 2>&1 | tail -1; done
C=$(mktemp -d)
SHAPEPLAN_CACHE_DIR=$C timeout 120 python3 bench/gpu_startup.py --label cold > /dev/null 2>&1
for l in 1 4 1 4 1 4; do
  SHAPEPLAN_CUDA_WARM_THREADS=$l SHAPEPLAN_CACHE_DIR=$C timeout 120 python3 bench/gpu_startup.py --label "threads=$l" --timeline > $O/warm_t$l.log 2>&1
  tail -1 $O/warm_t$l.log | cut -c1-170
done
