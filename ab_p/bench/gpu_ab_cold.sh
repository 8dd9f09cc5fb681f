#!/bin/bash
# Same-machine A/B of cold-start switches for the block stack (issue 5): every run gets new empty caches.
# Usage: VARIANTS="base:NICE=0,EARLY=0 nice:NICE=10,EARLY=0" REPS=3 bash bench/gpu_ab_cold.sh
# Each variant is NAME:KEY=VALUE,... with KEY one of NICE (SHAPEPLAN_TRITON_WORKER_NICE), EARLY
# (SHAPEPLAN_TRITON_EARLY) or TREE (run that tree's bench and package, e.g. one extracted with
# `mkdir ab_base && git archive REV shapeplan bench | tar -x -C ab_base`). Prints per run: ready s (sp.compile to the first replayed call), and from the
# timeline when the plan's optimizer finished (numerics configured), kernels were handed over, the last
# kernel compiled and the segment was captured (ms).
set -o pipefail
export PYTHONUNBUFFERED=1
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/sp_pycache}
python3 -m compileall -q shapeplan bench $(ls -d ab_base 2>/dev/null) > /dev/null
python3 -m compileall -q "$(python3 -c 'import os, triton; print(os.path.dirname(triton.__file__))')" > /dev/null
VARIANTS=${VARIANTS:-"base:NICE=0,EARLY=0 nice:NICE=10,EARLY=0 nice_early:NICE=10,EARLY=1"}
C=$(mktemp -d /tmp/spc_ab.XXXX)
python3 -c "import torch; torch.ones(1, device='cuda') @ torch.ones(1, 1, device='cuda')" > /dev/null   # CUDA libraries read once
printf "%-12s %3s %8s %10s %9s %12s %9s\n" variant rep ready_s optimized handover last_compile captured
for rep in $(seq 1 ${REPS:-3}); do
  for v in $VARIANTS; do
    name=${v%%:*}; kv=${v#*:}
    NICE=10; EARLY=0; TREE=.
    for a in ${kv//,/ }; do eval "$a"; done
    D=$C/$name.$rep
    L=${OUT:-/tmp}/ab_${name}_$rep.log
    (cd $TREE && SHAPEPLAN_TRITON_WORKER_NICE=$NICE SHAPEPLAN_TRITON_EARLY=$EARLY SHAPEPLAN_CACHE_DIR=$D \
      timeout 120 python3 bench/gpu_blocks.py --shapes 1x1 --no-compile --optimize --timeline --iters 20) > $L 2>&1
    ready=$(awk '$2=="triton"{print $5}' $L)
    opt=$(grep -m1 "numerics configured" $L | awk '{print $1}')
    hand=$(grep -m1 "warmed in parallel" $L | awk '{print $1}')
    last=$(grep "compiled in a worker" $L | tail -1 | awk '{print $1}')
    cap=$(grep -m1 "segment captured" $L | awk '{print $1}')
    printf "%-12s %3s %8s %10s %9s %12s %9s\n" $name $rep "$ready" "$opt" "$hand" "$last" "$cap"
  done
done
