#!/bin/bash
# One device call that re-checks the whole GPU side at the end of a session: GPU tests, the block stack,
# llama-1b decode (ours), start-up (bench/gpu_startup_matrix.sh). Usage on the GPU machine: bash bench/gpu_final.sh
set -o pipefail
export PYTHONUNBUFFERED=1 SHAPEPLAN_CACHE_DIR=/tmp/spc_final
O=${OUT:-/tmp/final}; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
timeout 170 python3 -m pytest -q tests/gpu tests/llm/test_gpu.py tests/llm/test_decode_attention.py \
  tests/runtime/test_triton_codegen.py tests/runtime/test_triton_workers.py 2>&1 | tee $O/tests.log | tail -8
timeout 70 python3 bench/gpu_blocks.py --shapes 1x1 --no-compile --optimize --iters 100 > $O/blocks.log 2>&1; tail -8 $O/blocks.log
timeout 100 python3 bench/gpu_decode.py --presets llama-1b --configs cuda_graphs,triton --json $O/decode1b.json \
  > $O/decode1b.log 2>&1; grep -v '^  running' $O/decode1b.log | tail -8
[ "${STARTUP:-1}" != 0 ] && bash bench/gpu_startup_matrix.sh     # cold/warm start-up, llama-1b and blocks
