#!/bin/bash
# Start-up on the GPU machine, cold (empty shapeplan + Triton caches) then warm, for the llama-1b
# pipeline (bench/gpu_startup.py: construction + a 32-token request) and the 12-layer block stack
# (bench/gpu_blocks.py "ready s": sp.compile to the first replayed call). "cold" is the first process on
# a freshly started machine (the OS file cache does not hold the CUDA libraries yet either); "cold_again"
# is a second cold start (new empty cache directories) after those runs, as on a machine where torch has
# run before. Usage: bash bench/gpu_startup_matrix.sh
# Env: WORKERS=0 also runs the cold llama start with the compile workers off (for comparison).
set -o pipefail
export PYTHONUNBUFFERED=1
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/sp_pycache}   # bytecode for read-only site-packages too, as an installed
python3 -m compileall -q shapeplan bench > /dev/null       # environment has it (pip compiles on install)
python3 -m compileall -q "$(python3 -c 'import os, triton; print(os.path.dirname(triton.__file__))')" > /dev/null
C=$(mktemp -d /tmp/spc_start.XXXX)
for run in cold warm cold_again; do
  [ $run = cold_again ] && D=$C/llama_again || D=$C/llama
  SHAPEPLAN_CACHE_DIR=$D timeout 90 python3 bench/gpu_startup.py --label $run ${TIMELINE:+--timeline} \
    > ${OUT:-/tmp}/startup_$run.log 2>&1; tail -1 ${OUT:-/tmp}/startup_$run.log
done
if [ "${WORKERS:-1}" = 0 ]; then
  SHAPEPLAN_TRITON_WORKERS=0 SHAPEPLAN_CACHE_DIR=$C/llama_noworkers timeout 90 python3 bench/gpu_startup.py \
    --label cold_no_workers 2>&1 | tail -1
fi
for run in cold warm cold_again; do
  [ $run = cold_again ] && D=$C/blocks_again || D=$C/blocks
  SHAPEPLAN_CACHE_DIR=$D timeout 120 python3 bench/gpu_blocks.py --shapes 1x1 --no-compile --optimize ${TIMELINE:+--timeline} \
    --iters 50 > ${OUT:-/tmp}/blocks_$run.log 2>&1; echo "blocks $run:"; grep -E "cuda_graphs|triton" ${OUT:-/tmp}/blocks_$run.log
done
