#!/bin/bash
# Sixth session: does the pipeline prepare its plans from records during the warm-up? Cold, then a warm
# start with its whole timeline. Logs under $OUT.
. bench/gpu_prelude.sh
C=$(mktemp -d)
SHAPEPLAN_CACHE_DIR=$C timeout 100 python3 bench/gpu_startup.py --label cold > $O/cold.log 2>&1
tail -1 $O/cold.log | cut -c1-120
ls $C/frozen | head
SHAPEPLAN_CACHE_DIR=$C timeout 100 python3 bench/gpu_startup.py --label warm --timeline > $O/warm.log 2>&1
grep -vE "FUSION|Triton kernel compiled" $O/warm.log | grep " ms " | cut -c1-200 | head -60
tail -1 $O/warm.log | cut -c1-120
