#!/bin/bash
# Sixth session: llama-1b start-up, three trees on one machine, runs interleaved (cold, then four warm):
# ab_s5 (the session's start, c98bc60), ab_c4 (capture first, a7969ce), . (plans prepared during the
# warm-up, SDPA size rule). Trees extracted with `git archive REV shapeplan bench | tar -x -C DIR`.
# Then the GPU tests. Logs under $OUT. The trees are ignored by git (/ab_*/): pass them in the device call's carry.
. bench/gpu_prelude.sh
python3 -m compileall -q ab_s5 ab_c4 > /dev/null
C=$(mktemp -d)
for l in cold w1 w2 w3 w4; do
  for t in ab_s5 ab_c4 .; do
    n=$(basename $(realpath $t)); [ $t = . ] && n=new
    startup_run $t $n $l
  done
done
SHAPEPLAN_CACHE_DIR=$C/new timeout 100 python3 bench/gpu_startup.py --label "new timeline" --timeline > $O/new_timeline.log 2>&1
grep -E "graph built|warm-up joined|prepared|warm-ups joined|eager run|segment captured|before any eager|constructed|FALLBACK" $O/new_timeline.log | sed -E 's/ +\{.*//' | tr -s ' ' | cut -c1-120
gpu_tests 280
