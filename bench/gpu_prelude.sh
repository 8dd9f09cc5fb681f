# Sourced by the device-call scripts: unbuffered output, bytecode compiled up front (shapeplan, bench,
# Triton: a fresh machine otherwise compiles it inside the first timed run), O = the log directory, and
# `gpu_tests SECONDS` (the GPU test set, summary printed, log in $O/tests.log).
export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/sp_pycache}
O=${OUT:-/tmp}
python3 -m compileall -q shapeplan bench $(ls -d ab_base 2>/dev/null) > /dev/null
python3 -m compileall -q "$(python3 -c 'import os, triton; print(os.path.dirname(triton.__file__))')" > /dev/null

gpu_tests() {
  timeout "${1:-280}" python3 -m pytest -q tests/gpu tests/llm/test_gpu.py tests/llm/test_decode_attention.py \
    tests/runtime/test_triton_codegen.py tests/runtime/test_triton_workers.py tests/runtime/test_triton_launch.py \
    > $O/tests.log 2>&1
  grep -E "passed|failed|error" $O/tests.log | tail -2; grep -E "^(FAILED|ERROR)" $O/tests.log | head -10
}

# `startup_run TREE NAME LABEL [ARGS...]`: one llama-1b start-up (bench/gpu_startup.py of TREE, cache
# $C/NAME), log in $O/NAME_LABEL.log, its JSON line printed (the A/B scripts interleave trees with it).
startup_run() {
  local tree=$1 name=$2 label=$3; shift 3
  SHAPEPLAN_CACHE_DIR=$C/$name timeout 100 python3 $tree/bench/gpu_startup.py --label "$name $label" "$@" \
    > $O/${name}_$label.log 2>&1
  tail -1 $O/${name}_$label.log | cut -c1-175
}
