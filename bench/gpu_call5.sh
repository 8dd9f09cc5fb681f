#!/bin/bash
# Fifth session, re-check after the capture GC fix: GPU tests, then llama-1b start-up (cold, warm x3).
export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/sp_pycache
O=${OUT:-/tmp}
python3 -m compileall -q shapeplan bench > /dev/null
python3 -m compileall -q "$(python3 -c 'import os, triton; print(os.path.dirname(triton.__file__))')" > /dev/null
timeout 300 python3 -m pytest -q tests/gpu tests/llm/test_gpu.py tests/llm/test_decode_attention.py \
  tests/runtime/test_triton_codegen.py tests/runtime/test_triton_workers.py tests/runtime/test_triton_launch.py > $O/tests.log 2>&1
grep -E "passed|failed|error" $O/tests.log | tail -2; grep -E "^(FAILED|ERROR)" $O/tests.log | head -10
C=$(mktemp -d)
for l in cold warm1 warm2 warm3; do
  SHAPEPLAN_CACHE_DIR=$C timeout 120 python3 bench/gpu_startup.py --label "$l" --timeline > $O/l1b_$l.log 2>&1
  tail -1 $O/l1b_$l.log | cut -c1-200
done
