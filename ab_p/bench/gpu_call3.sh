#!/bin/bash
# Fifth session, device call 3: GPU tests; a same-machine A/B of the llama-1b start (ab_base = the tree
# before frozen-plan records and stacked weight loading, vs this one; runs interleaved, timelines kept);
# 1b decode speed (triton). Logs under $OUT. Extract ab_base first:
#   mkdir ab_base && git archive <rev> shapeplan bench | tar -x -C ab_base
. bench/gpu_prelude.sh
gpu_tests 280
python3 bench/gpu_first_use.py > /dev/null 2>&1
C=$(mktemp -d)
for l in cold warm1 warm2 warm3; do
  for t in ab_base final; do
    [ $t = final ] && d=. || d=ab_base
    SHAPEPLAN_CACHE_DIR=$C/$t timeout 120 python3 $d/bench/gpu_startup.py --label "$t $l" --timeline > $O/${t}_$l.full 2>&1
    tail -1 $O/${t}_$l.full | cut -c1-190 | tee -a $O/ab.txt
  done
done
cp $O/final_warm2.full $O/final_warm2.log; cp $O/ab_base_warm2.full $O/base_warm2.log; cp $O/final_cold.full $O/final_cold.log
rm -f $O/*.full
timeout 200 python3 bench/gpu_decode.py --presets llama-1b --configs triton,cuda_graphs > $O/decode.log 2>&1
grep -E "^(triton|cuda_graphs) " $O/decode.log
grep -E "ms " $O/final_warm2.log | grep -E "t0|imported|driver|plan compiled|frozen|captured|compiled from|replaying  |constructed" | head -20
