#!/bin/bash
# Fifth session, last device call: GPU tests; llama-1b start-up (cold, then warm with Triton imported
# early vs not, interleaved); two cold block-stack starts. Logs under $OUT.
export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/sp_pycache
O=${OUT:-/tmp}
python3 -m compileall -q shapeplan bench > /dev/null
python3 -m compileall -q "$(python3 -c 'import os, triton; print(os.path.dirname(triton.__file__))')" > /dev/null
timeout 200 python3 -m pytest -q tests/gpu tests/llm/test_gpu.py tests/llm/test_decode_attention.py \
  tests/runtime/test_triton_codegen.py tests/runtime/test_triton_workers.py tests/runtime/test_triton_launch.py > $O/tests.log 2>&1
grep -E "passed|failed|error" $O/tests.log | tail -2; grep -E "^(FAILED|ERROR)" $O/tests.log | head -10
C=$(mktemp -d)
SHAPEPLAN_CACHE_DIR=$C timeout 100 python3 bench/gpu_startup.py --label cold --timeline > $O/l1b_cold.log 2>&1
tail -1 $O/l1b_cold.log | cut -c1-200
for l in 1 0 1 0 1 0; do
  SHAPEPLAN_TRITON_EARLY_IMPORT=$l SHAPEPLAN_CACHE_DIR=$C timeout 100 python3 bench/gpu_startup.py --label "early=$l" --timeline > $O/l1b_warm_e$l.log 2>&1
  tail -1 $O/l1b_warm_e$l.log | cut -c1-200
done
OUT=/tmp VARIANTS="final:NICE=10" REPS=2 timeout 60 bash bench/gpu_ab_cold.sh
