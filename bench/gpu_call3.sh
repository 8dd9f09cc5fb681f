#!/bin/bash
# Fifth session, device call 3: GPU tests; a same-machine A/B of the llama-1b start (ab_base = the tree
# before frozen-plan records and stacked weight loading, vs this one; runs interleaved, timelines kept);
# 1b decode speed (triton). Logs under $OUT. Extract ab_base first:
#   mkdir ab_base && git archive <rev> shapeplan bench | tar -x -C ab_base
export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/sp_pycache
O=${OUT:-/tmp}
python3 -m compileall -q shapeplan bench ab_base > /dev/null
python3 -m compileall -q "$(python3 -c 'import os, triton; print(os.path.dirname(triton.__file__))')" > /dev/null
timeout 280 python3 -m pytest -q tests/gpu tests/llm/test_gpu.py tests/llm/test_decode_attention.py \
  tests/runtime/test_triton_codegen.py tests/runtime/test_triton_workers.py tests/runtime/test_triton_launch.py > $O/tests.log 2>&1
grep -E "passed|failed|error" $O/tests.log | tail -2; grep -E "^(FAILED|ERROR)" $O/tests.log | head -10
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
