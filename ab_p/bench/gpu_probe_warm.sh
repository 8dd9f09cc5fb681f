#!/bin/bash
# Sixth session, first device call: where a llama-1b warm start goes (issue 7). A cold start fills a new
# cache; then warm starts with timelines (construction phases, warm-up parts, the first call's capture
# steps), one with cProfile of the main thread, one with the Triton warm-up pool off (every kernel
# load then runs on the main thread, so the profile shows it). Logs under $OUT.
. bench/gpu_prelude.sh
C=$(mktemp -d)
SHAPEPLAN_CACHE_DIR=$C timeout 100 python3 bench/gpu_startup.py --label cold --timeline > $O/cold.log 2>&1
tail -1 $O/cold.log | cut -c1-200
for i in 1 2 3; do
  SHAPEPLAN_CACHE_DIR=$C timeout 100 python3 bench/gpu_startup.py --label "warm$i" --timeline > $O/warm$i.log 2>&1
  tail -1 $O/warm$i.log | cut -c1-200
done
SHAPEPLAN_CACHE_DIR=$C timeout 100 python3 bench/gpu_startup.py --label prof --cprofile 90 > $O/prof.log 2>&1
tail -1 $O/prof.log | cut -c1-200
SHAPEPLAN_TRITON_WARM=0 SHAPEPLAN_CACHE_DIR=$C timeout 100 python3 bench/gpu_startup.py --label "prof-nowarm" --cprofile 90 > $O/prof_nowarm.log 2>&1
tail -1 $O/prof_nowarm.log | cut -c1-200
