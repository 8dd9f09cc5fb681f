#!/bin/bash
# Fifth session, device call 2: GPU tests with kernels loaded and launched through ctypes (triton_launch),
# then a same-machine A/B of cold block-stack starts (SHAPEPLAN_TRITON_CTYPES=1 vs 0, interleaved, new
# empty caches each run, bench/gpu_cold_probe.py --timeline), then llama-1b start-up: cold, warm x2 with
# ctypes, warm x1 without (same cache). Logs under $OUT.
. bench/gpu_prelude.sh
gpu_tests 260
python3 -c "import torch; torch.ones(1, device='cuda') @ torch.ones(1, 1, device='cuda')" > /dev/null
printf "%-8s %3s %8s %10s %10s %10s %10s\n" variant rep ready_s driver first_sent last_done captured > $O/ab.txt
for rep in ${REPS_LIST:-1 2 3}; do
  for v in on off; do
    c=1; [ $v = off ] && c=0
    L=$O/ab_${v}_$rep.log
    SHAPEPLAN_TRITON_CTYPES=$c SHAPEPLAN_CACHE_DIR=$(mktemp -d /tmp/spc.XXXX) timeout 120 \
      python3 bench/gpu_cold_probe.py --timeline > $L 2>&1
    ready=$(grep -o "to first replay [0-9.]*" $L | awk '{print $4}')
    drv=$(grep -m1 "driver ready" $L | awk '{print $1}')
    sent=$(grep "compiled in a worker" $L | grep -o "'sent_at_s': [0-9.]*" | awk '{print $2}' | sort -n | head -1)
    last=$(grep "compiled in a worker" $L | tail -1 | awk '{print $1}')
    cap=$(grep -m1 "segment captured" $L | awk '{print $1}')
    printf "%-8s %3s %8s %10s %10s %10s %10s\n" $v $rep "$ready" "$drv" "$sent" "$last" "$cap" >> $O/ab.txt
  done
done
cat $O/ab.txt
C=$(mktemp -d /tmp/spc1b.XXXX)
for name in l1b_cold:1 l1b_warm1:1 l1b_warm2:1 l1b_warm_off:0; do
  n=${name%%:*}; c=${name#*:}
  SHAPEPLAN_TRITON_CTYPES=$c SHAPEPLAN_CACHE_DIR=$C timeout 200 python3 bench/gpu_startup.py --preset llama-1b --mode triton --timeline > $O/$n.log 2>&1
  echo "== $n $(tail -1 $O/$n.log | cut -c1-200)"
done
grep -E "stamp|constructed|imported|driver" $O/l1b_warm1.log
