#!/bin/bash
# Sixth session, device call: prefill attention kernels (cuDNN vs memory-efficient); llama-1b warm start,
# new tree (capture before the eager run, efficient prefill attention) vs the same tree with both off,
# interleaved; step times; then the GPU tests. Logs under $OUT.
. bench/gpu_prelude.sh
timeout 60 python3 bench/gpu_prefill_attention.py > $O/attn.log 2>&1; cat $O/attn.log
C=$(mktemp -d)
SHAPEPLAN_CACHE_DIR=$C timeout 100 python3 bench/gpu_startup.py --label cold > $O/cold.log 2>&1
tail -1 $O/cold.log | cut -c1-160
show() { grep -E "graph built|warm-up joined|warm-ups joined|eager run|segment captured|before any eager|constructed" $1 | sed -E 's/ +\{.*//' | sed -E 's/(COMPILE|SEGMENT|GRAPH_REPLAY) //' | tr -s ' ' | paste -sd ';' | cut -c1-500; }
for r in 1 2 3; do for v in new old; do
  if [ $v = old ]; then E="SHAPEPLAN_CAPTURE_FIRST=0 SHAPEPLAN_LLM_PREFILL_ATTENTION=sdpa"; else E=""; fi
  env $E SHAPEPLAN_CACHE_DIR=$C timeout 100 python3 bench/gpu_startup.py --label "$v" --timeline > $O/w_${v}_$r.log 2>&1
  tail -1 $O/w_${v}_$r.log | cut -c1-150; show $O/w_${v}_$r.log
done; done
SHAPEPLAN_CACHE_DIR=$C timeout 100 python3 bench/gpu_startup.py --label steps --timeline --step-times > $O/steps.log 2>&1
tail -1 $O/steps.log | cut -c1-130; grep -A8 "eager-run steps" $O/steps.log | cut -c1-150
grep -E "FALLBACK|VERIFY" $O/w_new_*.log | head -5
gpu_tests 280
