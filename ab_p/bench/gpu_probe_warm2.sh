#!/bin/bash
# Sixth session: the llama-1b warm start's main thread, sampled (bench/stack_sampler.py), and the
# construction with the CUDA warm-up off / on one thread (is the main thread waiting for the warm-up's
# module loads?). Logs under $OUT.
. bench/gpu_prelude.sh
C=$(mktemp -d)
SHAPEPLAN_CACHE_DIR=$C timeout 100 python3 bench/gpu_startup.py --label cold > $O/cold.log 2>&1
tail -1 $O/cold.log | cut -c1-160
show() { grep -E "graph built|optimized|warm-up joined|warm-ups joined|eager run|segment captured|constructed" $1 | sed -E 's/ +\{.*//' | tr -s ' ' | paste -sd ';' | cut -c1-600; }
for v in "s1:" "s2:" "nowarm:SHAPEPLAN_CUDA_WARM=0" "warm1thread:SHAPEPLAN_CUDA_WARM_THREADS=1" "s3:"; do
  n=${v%%:*}; e=${v#*:}
  env $e SHAPEPLAN_CACHE_DIR=$C timeout 100 python3 bench/gpu_startup.py --label "$n" --timeline $( [ ${n:0:1} = s ] && echo --sample) > $O/$n.log 2>&1
  tail -1 $O/$n.log | cut -c1-160; show $O/$n.log
done
