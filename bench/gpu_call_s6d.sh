#!/bin/bash
# (ab_s5 is ignored by git: pass it in the device call's carry.)
# Sixth session, last device call: llama-1b start-up of this tree (cold, then six warm starts) interleaved
# with the session's starting tree ab_s5 (c98bc60; three warm), one timeline, and the GPU tests.
. bench/gpu_prelude.sh
python3 -m compileall -q ab_s5 > /dev/null
C=$(mktemp -d)
for l in cold w1 w2 w3 w4 w5 w6; do
  for t in ab_s5 .; do
    n=$t; [ $t = . ] && n=new
    case $l in w4|w5|w6) [ $n = ab_s5 ] && continue;; esac
    startup_run $t $n $l
  done
done
SHAPEPLAN_CACHE_DIR=$C/new timeout 100 python3 bench/gpu_startup.py --label "new timeline" --timeline > $O/timeline.log 2>&1
grep -vE "FUSION|Triton kernel compiled|-> REPLAYING|shapes frozen  " $O/timeline.log | grep -E " ms |warm-up part" | sed -E "s/'state': <[^>]*>//" | cut -c1-150 | head -40
tail -1 $O/timeline.log | cut -c1-175
gpu_tests 280
