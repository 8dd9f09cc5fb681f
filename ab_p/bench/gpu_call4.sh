#!/bin/bash
# Fifth session, final device call: GPU tests; the block stack (full table with 1x1 and 8x512, then four
# more cold starts with new empty caches: bench/gpu_ab_cold.sh); llama-1b start-up (cold, warm x3, with
# timelines); decode tok/s for llama-1b (triton, cuda_graphs) and llama-8b (triton). Logs under $OUT.
. bench/gpu_prelude.sh
gpu_tests 280
SHAPEPLAN_CACHE_DIR=$(mktemp -d) timeout 200 python3 bench/gpu_blocks.py --shapes 1x1,8x512 --optimize --no-compile --timeline > $O/blocks_full.log 2>&1
grep -E "^ +(1x1|8x512) " $O/blocks_full.log
OUT=/tmp VARIANTS="final:NICE=10" REPS=4 bash bench/gpu_ab_cold.sh
C=$(mktemp -d)
for l in cold warm1 warm2 warm3; do
  SHAPEPLAN_CACHE_DIR=$C timeout 120 python3 bench/gpu_startup.py --label "$l" --timeline > $O/l1b_$l.log 2>&1
  tail -1 $O/l1b_$l.log | cut -c1-230
done
timeout 150 python3 bench/gpu_decode.py --presets llama-1b --configs triton,cuda_graphs > $O/decode.log 2>&1
timeout 200 python3 bench/gpu_decode.py --presets llama-8b --configs triton >> $O/decode.log 2>&1
grep -E "^(triton|cuda_graphs) " $O/decode.log
