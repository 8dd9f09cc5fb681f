#!/bin/bash
# Sixth session: llama-1b warm start with the short GIL switch interval during start-up (default now)
# vs Python's 5 ms (SHAPEPLAN_STARTUP_SWITCH_INTERVAL=0), interleaved; then one run with the eager
# runs' step times and the sampled main thread. Logs under $OUT.
. bench/gpu_prelude.sh
C=$(mktemp -d)
SHAPEPLAN_CACHE_DIR=$C timeout 100 python3 bench/gpu_startup.py --label cold > $O/cold.log 2>&1
tail -1 $O/cold.log | cut -c1-160
show() { grep -E "graph built|warm-up joined|warm-ups joined|eager run|segment captured|constructed" $1 | sed -E 's/ +\{.*//' | sed -E 's/(COMPILE|SEGMENT|GRAPH_REPLAY) //' | tr -s ' ' | paste -sd ';' | cut -c1-400; }
for r in 1 2 3; do for si in 0.0002 0; do
  SHAPEPLAN_STARTUP_SWITCH_INTERVAL=$si SHAPEPLAN_CACHE_DIR=$C timeout 100 python3 bench/gpu_startup.py --label "si=$si" --timeline > $O/w_${si}_$r.log 2>&1
  tail -1 $O/w_${si}_$r.log | cut -c1-130; show $O/w_${si}_$r.log
done; done
SHAPEPLAN_CACHE_DIR=$C timeout 100 python3 bench/gpu_startup.py --label steps --timeline --step-times --sample > $O/steps.log 2>&1
tail -1 $O/steps.log | cut -c1-130; grep -A16 "eager-run steps" $O/steps.log | cut -c1-150
