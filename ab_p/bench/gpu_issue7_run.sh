#!/bin/bash
# One device call for issues 5 (open items) and 7: GPU tests, ONNX light models, block stack with the
# optimizer (cold then warm Triton cache), decode bench + profile. Usage: bash bench/gpu_issue7_run.sh
export PYTHONUNBUFFERED=1 SHAPEPLAN_CACHE_DIR=/tmp/spcache
O=${OUT:-/tmp}
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
[ -z "$SKIP_TESTS" ] && timeout 150 python3 -m pytest -q -x tests/gpu tests/plan/test_host_inputs.py 2>&1 | tail -8 | tee $O/tests.log
[ -z "$SKIP_LIGHT" ] && timeout 120 python3 bench/gpu_onnx_light.py --iters 10 --json $O/light.json > $O/light.log 2>&1; tail -40 $O/light.log | grep -v '^{'
if [ -z "$SKIP_BLOCKS" ]; then
  for run in cold warm; do
    echo "== blocks --optimize ($run Triton/plan cache)"
    timeout 100 python3 bench/gpu_blocks.py --shapes 1x1 --no-compile --optimize --iters 100 2>&1 | tail -6
  done
fi
timeout ${DECODE_T:-300} python3 bench/gpu_decode.py --presets ${PRESETS:-llama-1b} --configs ${CONFIGS:-slot_by_slot,cuda_graphs,triton} \
  ${VS:---vs-torch-compile} --json $O/decode.json 2>$O/decode.err | tee $O/decode.log
tail -5 $O/decode.err
timeout 120 python3 bench/gpu_decode_profile.py --preset ${PROF_PRESET:-llama-1b} --mode triton --tokens 64 2>&1 | tee $O/profile.log | head -60
