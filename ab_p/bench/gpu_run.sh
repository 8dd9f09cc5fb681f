#!/bin/bash
# One device call: GPU tests, then the block benchmark. Usage on the GPU machine: bash bench/gpu_run.sh
export PYTHONUNBUFFERED=1 SHAPEPLAN_CACHE_DIR=/tmp/spcache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
timeout 200 python3 -m pytest -q -x tests/gpu tests/runtime/test_triton_codegen.py 2>&1 | tail -15
timeout 330 python3 bench/gpu_blocks.py --json ${OUT:-/tmp}/gpu_blocks.json "$@" 2>&1 | tail -25
