#!/bin/bash
# One device call (issue 6 reproducibility + issue 7 start-up), at most ~200 s:
#   the bf16 seeded-sampling GPU test, the new triton reproducibility tests, tests/gpu, then
#   bench/gpu_startup.py for llama-1b in fresh processes: cold (empty cache), warm (same cache),
#   warm under cProfile, and cold again with the parallel warm-up off (SHAPEPLAN_TRITON_WARM=0).
set -o pipefail
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/i67}; mkdir -p $O
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
timeout ${TPYTEST:-95} python3 -m pytest -q -x -p no:cacheprovider \
  "tests/llm/test_gpu.py::test_gpu_bf16_preset_sessions_and_sampling" tests/llm/test_triton_reproducible.py tests/gpu \
  2>&1 | tee $O/pytest.log | tail -6
C=/tmp/spc_i67_$RANDOM
for run in cold warm; do
  SHAPEPLAN_CACHE_DIR=$C timeout 40 python3 bench/gpu_startup.py --label $run > $O/startup_$run.log 2>&1; tail -1 $O/startup_$run.log
done
SHAPEPLAN_CACHE_DIR=$C timeout 30 python3 bench/gpu_startup.py --label warm_prof --cprofile 30 > $O/startup_prof.log 2>&1
SHAPEPLAN_CACHE_DIR=${C}_nowarm SHAPEPLAN_TRITON_WARM=0 timeout 40 python3 bench/gpu_startup.py --label cold_nowarm \
  > $O/startup_cold_nowarm.log 2>&1; tail -1 $O/startup_cold_nowarm.log
echo "| run | construct s | first request s | start s | late_steady_64 |"
for f in cold warm warm_prof cold_nowarm; do
  python3 - "$O/startup_$f.log" <<'PY'
import json, sys
try:
    d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
    print(f"| {d['label']} | {d['construct_s']} | {d['first_request_s']} | {d['start_s']} | {d['late_steady_64']} |")
except Exception as e:
    print(f"| {sys.argv[1]} | failed: {e} |")
PY
done
sed -n '/Ordered by/,$p' $O/startup_prof.log | head -40 | cut -c1-150
