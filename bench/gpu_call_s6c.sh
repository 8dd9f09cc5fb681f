#!/bin/bash
# Sixth session: llama-1b start-up, three trees on one machine, runs interleaved (cold, then four warm):
# ab_s5 (the session's start, c98bc60), ab_p (capture first + plans prepared, which the blocked engine
# creation kept from running), . (state made before the warm-up, adopted by the engine). Then a
# timeline of the new tree, the GPU tests and llama-1b decode speed. Logs under $OUT. (ab_* are ignored by
# git: pass them in the device call's carry.)
. bench/gpu_prelude.sh
python3 -m compileall -q ab_s5 ab_p > /dev/null
C=$(mktemp -d)
for l in cold w1 w2 w3 w4; do
  for t in ab_s5 ab_p .; do
    n=$t; [ $t = . ] && n=new
    startup_run $t $n $l
  done
done
SHAPEPLAN_CACHE_DIR=$C/new timeout 100 python3 bench/gpu_startup.py --label "new timeline" --timeline > $O/timeline.log 2>&1
grep -vE "FUSION|Triton kernel compiled|-> REPLAYING|shapes frozen  " $O/timeline.log | grep -E " ms " | sed -E "s/'state': <[^>]*>//" | cut -c1-150 | head -40
tail -1 $O/timeline.log | cut -c1-175
gpu_tests 280
timeout 150 python3 bench/gpu_decode.py --presets llama-1b --configs triton > $O/decode.log 2>&1; tail -8 $O/decode.log | cut -c1-200
