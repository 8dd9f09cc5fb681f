#!/bin/bash
# Issue 5/7 probe (fifth session): where the cold block-stack chain and the warm llama-1b start go.
# Cold block stack: 3 runs as they are, 2 with the workers started and ready before the clock (the floor
# without their start), 2 with Triton's line info off (compile time); each with new empty caches and the
# per-kernel compile / launcher-build split. llama-1b: one cold start, two warm with timelines, one warm
# cProfile. Logs under $OUT (or /tmp).
. bench/gpu_prelude.sh
python3 -c "import torch; torch.ones(1, device='cuda') @ torch.ones(1, 1, device='cuda')" > /dev/null
run() {  # name, env..., -- args
  local name=$1; shift
  SHAPEPLAN_CACHE_DIR=$(mktemp -d /tmp/spc.XXXX) timeout 120 env "$@" > $O/$name.log 2>&1
  echo "== $name: $(grep -E 'to first replay' $O/$name.log)"
  grep -E "worker ready|compiled in a worker|imported in this|driver ready|warmed in parallel|segment captured|workers started|numerics" $O/$name.log | head -40
}
for i in 1 2 3; do run cold_$i python3 bench/gpu_cold_probe.py --timeline; done
for i in 1 2; do run prestart_$i python3 bench/gpu_cold_probe.py --timeline --prestart; done
for i in 1 2; do run noline_$i TRITON_DISABLE_LINE_INFO=1 python3 bench/gpu_cold_probe.py --timeline; done
C=$(mktemp -d /tmp/spc1b.XXXX)
for name in l1b_cold l1b_warm1 l1b_warm2; do
  SHAPEPLAN_CACHE_DIR=$C timeout 200 python3 bench/gpu_startup.py --preset llama-1b --mode triton --timeline > $O/$name.log 2>&1
  echo "== $name"; grep -E "^\{|constructed|ms " $O/$name.log | grep -E "^\{|constructed|frozen|captured|replaying|compiled|warmed|t0|imported|driver" | head -40
done
SHAPEPLAN_CACHE_DIR=$C timeout 200 python3 bench/gpu_startup.py --preset llama-1b --mode triton --cprofile 60 > $O/l1b_prof.log 2>&1
tail -1 $O/l1b_prof.log
