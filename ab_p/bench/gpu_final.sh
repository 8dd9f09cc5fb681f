#!/bin/bash
# One device call that re-checks the whole GPU side at the end of a session: GPU tests, the block stack,
# llama-1b decode (ours), start-up (bench/gpu_startup_matrix.sh). Usage on the GPU machine: bash bench/gpu_final.sh
set -o pipefail
export PYTHONUNBUFFERED=1 SHAPEPLAN_CACHE_DIR=/tmp/spc_final
O=${OUT:-/tmp/final}; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'archs', torch.cuda.get_arch_list())"
timeout 170 python3 -m pytest -q tests/gpu tests/llm/test_gpu.py tests/llm/test_decode_attention.py \
  tests/runtime/test_triton_codegen.py tests/runtime/test_triton_workers.py 2>&1 | tee $O/tests.log | tail -8
timeout 70 python3 bench/gpu_blocks.py --shapes 1x1 --no-compile --optimize --iters 100 > $O/blocks.log 2>&1; tail -8 $O/blocks.log
timeout 100 python3 bench/gpu_decode.py --presets llama-1b --configs cuda_graphs,triton --json $O/decode1b.json \
  > $O/decode1b.log 2>&1; grep -v '^  running' $O/decode1b.log | tail -8
[ "${STARTUP:-1}" != 0 ] && bash bench/gpu_startup_matrix.sh     # cold/warm start-up, llama-1b and blocks
# REPEAT=N: N more cold block-stack starts and N more warm llama-1b starts (fresh cache dirs / one warm dir)
for i in $(seq 1 ${REPEAT:-0}); do
  D=$(mktemp -d /tmp/spc_rep.XXXX)
  SHAPEPLAN_CACHE_DIR=$D timeout 120 python3 bench/gpu_blocks.py --shapes 1x1 --no-compile --optimize --iters 20 \
    2>/dev/null | grep -E "^ +1x1 triton" | sed "s/^/blocks cold repeat $i: /"
done
if [ "${REPEAT:-0}" -gt 0 ]; then
  W=$(mktemp -d /tmp/spc_repw.XXXX)
  SHAPEPLAN_CACHE_DIR=$W timeout 90 python3 bench/gpu_startup.py --label cold_for_repeats 2>&1 | tail -1
  for i in $(seq 1 ${REPEAT}); do
    SHAPEPLAN_CACHE_DIR=$W timeout 90 python3 bench/gpu_startup.py --label warm_repeat_$i 2>&1 | tail -1
  done
fi
