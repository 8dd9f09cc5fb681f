#!/bin/bash
# One device call for issue 7 (decode speed, start-up, memory), printing a short table at the end.
# Env: SNAP (tree to run, default .), DECODE8B_VS (set to 1 for torch baselines on 8b), PROFILE (0 = skip).
set -o pipefail
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/issue7}; mkdir -p $O
cd ${SNAP:-.}
nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm --format=csv,noheader 
export SHAPEPLAN_CACHE_DIR=/tmp/spc_issue7_$RANDOM
for run in cold warm; do
  timeout 70 python3 bench/gpu_startup.py --label $run > $O/startup_$run.log 2>&1; tail -1 $O/startup_$run.log
done
[ "${STARTUP_PROF:-1}" != 0 ] && { timeout 70 python3 bench/gpu_startup.py --label warm_prof --cprofile 45 > $O/startup_prof.log 2>&1; tail -1 $O/startup_prof.log; }
[ -n "$EXTRA" ] && eval "$EXTRA"
if [ -n "$ATTN_SWEEP" ]; then
  timeout 90 python3 bench/gpu_decode_attention.py --pos 256 > $O/attn.log 2>&1; cat $O/attn.log | tail -16
  export SHAPEPLAN_DECODE_ATTN=$(grep '^BEST=' $O/attn.log | cut -d= -f2); echo "decode attention: ${SHAPEPLAN_DECODE_ATTN:-default}"
fi
timeout ${T1B:-150} python3 bench/gpu_decode.py --presets llama-1b --configs slot_by_slot,cuda_graphs,triton \
  --vs-torch-compile --json $O/decode1b.json > $O/decode1b.log 2>&1; grep -v '^  running' $O/decode1b.log | tail -14
timeout ${T8B:-120} python3 bench/gpu_decode.py --presets llama-8b --configs cuda_graphs,triton \
  ${DECODE8B_VS:+--vs-torch-compile} > $O/decode8b.log 2>&1; grep -v '^  running' $O/decode8b.log | tail -12
if [ "${PROFILE:-1}" != 0 ]; then
  timeout 80 python3 bench/gpu_decode_profile.py --preset llama-1b --mode triton --tokens 64 --rows 30 > $O/profile.log 2>&1
  head -4 $O/profile.log; sed -n "/Name/,\$p" $O/profile.log | head -34 | cut -c1-200
fi
