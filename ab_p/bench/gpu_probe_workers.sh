#!/bin/bash
# Compile-worker start-up probe on the GPU machine (issue 5's cold start): spawned workers vs forks of a
# zygote (bench/gpu_probe_workers.py), where a Triton import's time goes (-X importtime, the dynamic
# loader's statistics for libtriton.so), then bench/gpu_probe_startup.sh. Usage: bash bench/gpu_probe_workers.sh
set -o pipefail
export PYTHONUNBUFFERED=1
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/sp_pycache}
python3 -m compileall -q shapeplan bench > /dev/null
python3 -m compileall -q "$(python3 -c 'import os, triton; print(os.path.dirname(triton.__file__))')" > /dev/null
P=$(python3 -c 'import sys; print(":".join(p for p in sys.path if p))')
python3 bench/gpu_probe_workers.py --n 8 --repeat 2
echo "== python -S -X importtime -c 'import triton' (largest self times, us)"
PROBE_PATH=$P python3 -S -X importtime -c "import os, sys; sys.path += os.environ['PROBE_PATH'].split(':'); import triton" 2>&1 \
  | sort -t'|' -k1 -n | tail -12
echo "== dynamic loader, libtriton.so"
PROBE_PATH=$P LD_DEBUG=statistics python3 -S -c "import os, sys; sys.path += os.environ['PROBE_PATH'].split(':'); import triton._C.libtriton" 2>&1 \
  | grep -E "startup time|relocation|load" | tail -8
bash bench/gpu_probe_startup.sh
