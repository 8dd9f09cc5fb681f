#!/bin/bash
# Fifth session, last device call: GPU tests; llama-1b start-up (cold, then warm with Triton imported
# early vs not, interleaved); two cold block-stack starts. Logs under $OUT.
. bench/gpu_prelude.sh
gpu_tests 200
C=$(mktemp -d)
SHAPEPLAN_CACHE_DIR=$C timeout 100 python3 bench/gpu_startup.py --label cold --timeline > $O/l1b_cold.log 2>&1
tail -1 $O/l1b_cold.log | cut -c1-200
for l in 1 0 1 0 1 0; do
  SHAPEPLAN_TRITON_EARLY_IMPORT=$l SHAPEPLAN_CACHE_DIR=$C timeout 100 python3 bench/gpu_startup.py --label "early=$l" --timeline > $O/l1b_warm_e$l.log 2>&1
  tail -1 $O/l1b_warm_e$l.log | cut -c1-200
done
OUT=/tmp VARIANTS="final:NICE=10" REPS=2 timeout 60 bash bench/gpu_ab_cold.sh
