#!/bin/bash
# The GPU tests and every GPU benchmark in one device call, each step under its own time limit and all
# of them inside one time budget (570 s by default, so a 10-minute call ends with its summary); prints a
# summary table last. Run from the repository root on the GPU machine:
#
#   bash bench/gpu_all.sh                  # the default steps: GPU tests, then the benchmarks
#   bash bench/gpu_all.sh --quick          # decode, start-up and block stack only (no tests)
#   bash bench/gpu_all.sh decode_8b logits # named steps only, in the order of the table below
#   bash bench/gpu_all.sh --all --budget 1500   # every step (more than 10 minutes: raise the budget)
#   bash bench/gpu_all.sh --list           # the steps, their sets and limits
#
# $OUT (if set) receives three files: gpu_all.log (every step's output), results.json (the JSON the
# benchmarks wrote, by step) and summary.txt (the table printed last). A `.wheels312/` folder in the
# root (Python 3.12 wheels carried with the call: bench/README.md says how) is installed first, offline.
# Adding a benchmark: one `step` line below (name, set, limit in s, command, one-line summary of its log).
set -o pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

step() {                                   # step NAME SET LIMIT_S COMMAND SUMMARY
  NAMES+=("$1"); SETS+=("$2"); LIMITS+=("$3"); CMDS+=("$4"); SUMS+=("$5")
}
# In COMMAND and SUMMARY: $W/NAME.json is the step's JSON (collected into results.json), $L its log.
# SUMMARY prints one line for the table; '' (or no output) takes the log's last line instead.
# Sets: quick (also in --quick), default (a plain run), extra (only by name or with --all).
GPU_TESTS="tests/gpu tests/llm/test_gpu.py tests/llm/test_decode_attention.py tests/llm/test_triton_reproducible.py tests/ops/test_fused_linear.py
           tests/runtime/triton"
# the quantized-weight tests on two steps of their own: with the rest they ran past one step's limit (~150 s of
# kernels per GGUF type; tests/ops/test_quant_ops.py alone took 162 s on the H200, twelfth session;
# tests/gpu/test_quantized.py + the int4 reference 294 s with an empty Triton cache, thirteenth); their wheel
# (gguf) comes from .wheels312
QUANT_TESTS="tests/ops/test_quant_ops.py"
QUANT_GPU_TESTS="tests/gpu/test_quantized.py tests/llm/test_reference_int4.py"
step tests default 300 'python3 -m pytest -q -p no:cacheprovider $XDIST --ignore=tests/gpu/test_quantized.py $(existing $GPU_TESTS)' \
  'grep -E "[0-9]+ (passed|failed|error)" $L | tail -1'
step tests_quant default 300 'python3 -m pytest -q -p no:cacheprovider $XDIST $(existing $QUANT_TESTS)' \
  'grep -E "[0-9]+ (passed|failed|error)" $L | tail -1'
step tests_quant_gpu default 330 'python3 -m pytest -q -p no:cacheprovider $XDIST $(existing $QUANT_GPU_TESTS)' \
  'grep -E "[0-9]+ (passed|failed|error)" $L | tail -1'
# onnxruntime against shapeplan.ort on the same models (the table names the providers each one used)
step ort_session extra 240 'python3 -m bench.ort_session --models mlp768,squeezenet,resnet50 --batches 1,8 --device cuda --json $W/ort_session.json' \
  'grep -A8 "^onnxruntime vs" $L | tr -s " " | tr "\n" ";"'
# the KServe server with its model on the GPU (Triton layout, shared memory, batching; thirty-second session)
step tests_kserve extra 120 'python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kserve_cuda.py' \
  'grep -E "[0-9]+ (passed|failed|error|skipped)" $L | tail -1'
# the twenty-first session's attention-written codes for o (SHAPEPLAN_QUANT_ATTN_X) alone: its GPU test, and the paged
# kernels whose merges write them (a short first look before the whole quantized-weight step)
# the quantized model tests that the integer tensor-core GEMM's routing touches (batched decode, every mode's tokens)
step tests_mmq extra 240 'python3 -m pytest -q -p no:cacheprovider $XDIST tests/gpu/test_quantized.py -k "batched or repacked or pdl or gguf_model or bench_quantize"' \
  'grep -E "[0-9]+ (passed|failed|error)" $L | tail -1'
step tests_attn_x extra 240 'python3 -m pytest -q -p no:cacheprovider $XDIST tests/gpu/test_quantized.py::test_attention_codes_for_o_on_cuda tests/runtime/triton/kernels/test_paged.py' \
  'grep -E "[0-9]+ (passed|failed|error)" $L | tail -1'
step decode quick 150 'python3 -m shapeplan bench --preset llama-1b --device cuda --config triton --json $W/decode.json' \
  'awk '\''$1=="triton" {print "llama-1b triton late_steady " $(NF-2) " tok/s, cold " $2 " s"}'\'' $L'
step startup quick 150 'python3 -m bench.startup --preset llama-1b --mode triton --warm 3 --json $W/startup.json' \
  'awk '\''$1=="cold" || $1 ~ /^warm/ {s = s $1 " " $4 " s, "; mb = $5} END {if (s) print s "beyond weights " mb " MB"}'\'' $L'
# the forty-sixth session's preload (SHAPEPLAN_TRITON_PRELOAD, off by default, never run on a GPU yet): its GPU tests,
# then one cache (a cold start with it on records the kernels) and warm starts off / on alternating, three rounds;
# then a warm start's timeline with it on and cProfile's callers of compile/exec with it off and on
step startup_preload extra 420 'python3 -m pytest -q -p no:cacheprovider tests/runtime/triton/test_preload.py "tests/llm/test_gpu.py::test_gpu_a_warm_start_freezes_from_records_and_gives_the_same_tokens"
  P=$W/preload_cache; SHAPEPLAN_TRITON_PRELOAD=1 SHAPEPLAN_CACHE_DIR=$P python3 -m bench.startup --once --label cold | tail -1
  for r in 1 2 3; do for p in 0 1; do SHAPEPLAN_TRITON_PRELOAD=$p SHAPEPLAN_CACHE_DIR=$P python3 -m bench.startup --once --label preload$p | tail -1; done; done
  SHAPEPLAN_TRITON_PRELOAD=1 SHAPEPLAN_CACHE_DIR=$P python3 -m bench.startup --once --timeline --label timeline_on
  for p in 0 1; do SHAPEPLAN_TRITON_PRELOAD=$p SHAPEPLAN_CACHE_DIR=$P python3 -m bench.startup --once --cprofile 40 --label cprofile$p; done' \
  'grep -E "[0-9]+ (passed|failed|error)" $L | tail -1 | tr "\n" ";"; python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1]) if l.startswith(\"{\\\"\")]; print(\"; \".join(x[\"label\"] + \" \" + str(x[\"start_s\"]) for x in r))" $L'
step generate_cmd default 120 'python3 -m bench.startup --generate-cmd --preset llama-1b --device cuda --json $W/generate_cmd.json' \
  'awk '\''$1=="wall" {print "shapeplan generate llama-1b 256 tokens: first " $2 " s, second " $3 " s"}'\'' $L'
# the command with --keep-alive (the first run starts the server that keeps the model loaded, the next two stream from it)
step generate_keepalive default 150 'python3 -m bench.startup --generate-cmd --preset llama-1b --device cuda --runs 3 --keep-alive 300 --json $W/generate_keepalive.json' \
  'awk '\''$1=="wall" {print "shapeplan generate --keep-alive, llama-1b 256 tokens: first " $2 " s, second " $3 " s, third " $4 " s"}'\'' $L'
# the tokenizer parsed on a thread beside the weights load (SHAPEPLAN_TOKENIZER_THREAD=on; off by default) against
# not, alternating, two runs of the command each (the second run is the 2.0 s target's)
step generate_cmd_tok extra 300 'for r in 1 2; do for t in off on; do echo "tokenizer thread $t"; SHAPEPLAN_TOKENIZER_THREAD=$t python3 -m bench.startup --generate-cmd --preset llama-1b --device cuda; done; done' \
  'awk '\''$1=="tokenizer" {t=$3} $1=="wall" {printf "thread %s: %s / %s s; ", t, $2, $3}'\'' $L'
# the twenty-first session's start-up changes, never run on a GPU: the cyclic garbage collector held off during
# start-up (SHAPEPLAN_GC_PAUSE, on) and tokenizer.json parsed in a helper process (SHAPEPLAN_TOKENIZER_PROCESS, auto: on
# with 4+ CPUs, as there); "old" (both off), "gc" (the first), "both", alternating, two rounds, two runs of the command each
step generate_cmd_ab extra 420 'for r in 1 2; do for c in old gc both; do g=1; t=1; [ $c = old ] && g=0; [ $c = both ] || t=0; echo "config $c"; SHAPEPLAN_GC_PAUSE=$g SHAPEPLAN_TOKENIZER_PROCESS=$([ $t = 1 ] && echo on || echo off) python3 -m bench.startup --generate-cmd --preset llama-1b --device cuda; done; done' \
  'awk '\''$1=="config" {t=$2} $1=="wall" {printf "%s: %s / %s s; ", t, $2, $3}'\'' $L'
# the weights' load threads (SHAPEPLAN_LOAD_THREADS: 4 by default) against 8, alternating, two rounds of the command
# (forty-second session: the "weights" phase read 2.47 GB in ~0.4 s, ~6 GB/s, on the H100 of the forty-first)
step generate_cmd_threads extra 300 'for r in 1 2; do for n in 4 8; do echo "load threads $n"; SHAPEPLAN_LOAD_THREADS=$n python3 -m bench.startup --generate-cmd --preset llama-1b --device cuda; done; done' \
  'awk '\''$1=="load" {t=$3} $1=="weights" {w=$2 "/" $3} $1=="wall" {x=$2 " / " $3} $1=="exit" {printf "%s threads: %s s (weights %s); ", t, x, w}'\'' $L'
step block_stack quick 150 'python3 -m bench.block_stack --shapes 1x1,8x512 --optimize --no-compile --json $W/block_stack.json' \
  'awk '\''$2=="cuda_graphs" || $2=="triton" {printf "%s %s %s ms (ready %s s); ", $1, $2, $3, $5}'\'' $L'
SERVE='python3 -m shapeplan bench --device cuda --config triton --prompt-len 128 --new-tokens 256'
SERVE_SUM='awk '\''$1=="shapeplan" {printf "%s req: %s tok/s, TTFT p50 %s ms, ITL p50 %s ms, prefill %s tok; ", $3, $5, $6, $8, $10}'\'' $L'
step serve_batch quick 240 "$SERVE --preset llama-1b --batch 64 --json \$W/serve_batch.json" "$SERVE_SUM"
step serve_prefix default 240 "$SERVE --preset llama-1b --batch 64 --prompt-len 64 --shared-prefix 1024 --new-tokens 64 --json \$W/serve_prefix.json && $SERVE --preset llama-1b --batch 64 --prompt-len 64 --shared-prefix 1024 --new-tokens 64 --no-prefix-cache" "$SERVE_SUM"
# the batched engine on quantized weights (16 requests: its 9-16-row buckets take the fused GEMM with 16-row tiles,
# twenty-fourth session) beside the same preset in bf16
step serve_quant extra 300 "$SERVE --preset llama-8b --quantize Q4_K_M --batch 16 --new-tokens 128 && $SERVE --preset llama-8b --batch 16 --new-tokens 128" "$SERVE_SUM"
# the same at 8 requests (decode buckets of up to 8 rows: the one-row kernels a program per row, twenty-fifth session)
step serve_quant8 extra 300 "$SERVE --preset llama-8b --quantize Q4_K_M --batch 8 --new-tokens 128 && $SERVE --preset llama-8b --batch 8 --new-tokens 128" "$SERVE_SUM"
# Q4_K_M and Q8_0 at 8 and 16 requests: the integer tensor-core GEMM (kernels/mmq.py) off (0), then as by default
mmq_ab() {                                 # mmq_ab "BATCHES": llama-8b Q4_K_M and Q8_0, the integer GEMM off then default
  echo "for q in Q4_K_M Q8_0; do for b in $1; do SHAPEPLAN_QUANT_MMQ_MAX_ROWS=0 $SERVE --preset llama-8b --quantize \$q --batch \$b --new-tokens 128 && $SERVE --preset llama-8b --quantize \$q --batch \$b --new-tokens 128; done; done"
}
step serve_quant_mmq extra 480 "$(mmq_ab '8 16')" "$SERVE_SUM"
# the integer tensor-core GEMM's tilings (mmq.MMQ) at the decode buckets it serves, ranked per type over the shapes
step quant_mmq_sweep extra 420 'python3 -m bench.quant_gemv --no-gemv --mmq-sweep 8,16 --qtypes Q4_K_R,Q6_K_R,Q8_0_R --presets llama-8b,llama-1b --top 2' \
  'grep -A2 "^# M=" $L | grep -E "^# M|^    \(" | sed -E "s/: mmq tilings.*//; s/ +/ /g" | paste -d" " - - - | tr "\n" ";"'
# the same at 8 requests only (a short call)
step serve_quant_mmq8 extra 300 "$(mmq_ab 8)" "$SERVE_SUM"
step serve_8b extra 300 "$SERVE --preset llama-8b --batch 64 --json \$W/serve_8b.json" "$SERVE_SUM"
step serve_sweep extra 300 "$SERVE --preset llama-1b --sweep 1,8,32,64,128 --json \$W/serve_sweep.json --plot \$O/serve_sweep.png" "$SERVE_SUM"
# the OpenAI-compatible server in the background, then streaming HTTP clients (docs/serve.md); the plot comes back in $OUT
SERVE_HTTP='python3 -m shapeplan serve --preset llama-1b --device cuda --mode triton --max-num-seqs 128 --max-kv-cache-length 1024 --port 8019 --log-level warning > $W/serve_http_server.log 2>&1 & S=$!
for i in $(seq 900); do grep -q "^serving" $W/serve_http_server.log && break; kill -0 $S 2>/dev/null || break; sleep 0.5; done
python3 -m shapeplan bench --serve http://127.0.0.1:8019 --concurrency 1,8,32,64,128 --prompt-len 128 --new-tokens 256 --json $W/serve_http.json --plot $O/serve_http.png; rc=$?
kill $S; wait $S; tail -3 $W/serve_http_server.log; exit $rc'
step serve_http extra 480 "$SERVE_HTTP" 'awk '\''$1 ~ /^[0-9]+$/ && NF >= 12 {printf "%s clients %s tok/s TTFT p50 %s ms err %s; ", $1, $5, $7, $3}'\'' $L'
step serve_vs_hf extra 300 "$SERVE --preset llama-1b --batch 64 --vs-hf" 'grep -E "^(shapeplan|transformers)" $L | awk '\''{printf "%s %s tok/s; ", $1, ($1=="shapeplan" ? $5 : $6)}'\'''
step serve_kserve default 240 'python3 -m bench.serve_kserve --model resnet50 --device cuda --clients 32 --client-procs 4 --seconds 20' \
  'tail -13 $L | paste -sd" " | cut -c1-420'
# the same with two engine instances per model (one copies its batch in and its results out while the other runs; docs/serve.md)
step serve_kserve_i2 extra 240 'python3 -m bench.serve_kserve --model resnet50 --device cuda --clients 32 --client-procs 4 --seconds 20 --instances 2' \
  'tail -13 $L | paste -sd" " | cut -c1-420'
# the same with the gRPC connections in 4 front-end processes (shapeplan serve --grpc-procs 4; docs/serve.md), load rows
# only; then with two engine instances as well
step serve_kserve_p4 extra 200 'python3 -m bench.serve_kserve --model resnet50 --device cuda --clients 32 --client-procs 4 --seconds 20 --grpc-procs 4 --skip-overhead' \
  'tail -8 $L | paste -sd" " | cut -c1-520'
step serve_kserve_p4i2 extra 200 'python3 -m bench.serve_kserve --model resnet50 --device cuda --clients 32 --client-procs 4 --seconds 20 --grpc-procs 4 --instances 2 --skip-overhead' \
  'tail -8 $L | paste -sd" " | cut -c1-520'
step gemv default 120 'python3 -m bench.gemv --pdl --json $W/gemv.json' \
  'awk '\''$1 ~ /^llama/ && NF >= 9 {printf "%s %s fused %s us (cuBLAS %s); ", $1, $2, $6, $4}'\'' $L | cut -c1-400'
# the bf16 GEMV tiles re-swept on llama-8b's layer shapes as decode launches them (PDL), the committed tiles timed
# in the same run (forty-fifth session: 245 tok/s needs 23 us less a step; the tiles were swept without PDL, 2026-12-01)
step gemv_sweep_8b extra 300 'python3 -m bench.gemv --presets llama-8b --roles qkv,o,gate_up,down --sweep --pdl --json $W/gemv_sweep_8b.json' \
  'grep -E "^    \(" $L | tr -s " " | tr "\n" ";" | cut -c1-400'
step quant_gemv default 200 'python3 -m bench.quant_gemv --prefill-m 128,512,2048' \
  'grep -iE "Q4_K|Q8_0" $L | head -3 | paste -sd" " | cut -c1-300'
step quant_e2e default 300 'python3 -m bench.quant_gemv --no-gemv --e2e llama-1b:Q4_K_M,llama-1b:Q8_0,llama-8b:Q4_K_M,llama-8b:Q8_0' \
  'grep -E "llama-(1b|8b)" $L | tail -4 | paste -sd" " | cut -c1-300'
# the prefill paths on our layouts (what a GGUF load runs on a GPU): the fused dequantize-into-tl.dot GEMM against
# dequantize to a scratch buffer + cuBLAS, at prompt-sized rows, every llama-8b and llama-1b shape (issue 19's "measure
# and choose": auto takes the fused GEMM up to gguf.GEMM["fused_max_m"] = 128 rows, a guess until this runs); the
# summary sums each (preset, type, M) over the shapes: fused / dequant+cuBLAS us
# where a llama-1b quantized decode step goes (its targets: Q8_0 1,200 tok/s, Q4_K_M 1,500): the e2e rows, then each
# model's per-kernel table (torch.profiler over 32 tokens), as bench.decode --profile prints it for bf16
step quant_profile_1b extra 300 'python3 -m bench.quant_gemv --no-gemv --e2e llama-1b:Q8_0,llama-1b:Q4_K_M --e2e-configs triton --profile 32' \
  'grep "Self CUDA time total" $L | paste -sd" "'
step quant_prefill extra 480 'python3 -m bench.quant_gemv --qtypes Q4_K_R,Q6_K_R,Q8_0_R --presets llama-8b,llama-1b --m 1 --prefill-m 16,64,128,512,2048' \
  'awk '\''$6=="fused" {f[$1" "$4" M"$5]+=$8} $6=="dequant+cuBLAS" {d[$1" "$4" M"$5]+=$7} END {for (k in f) printf "%s %.0f/%.0f; ", k, f[k], d[k]}'\'' $L | cut -c1-600'
# the fused GEMM's tiling (bm, bn, bk, warps, stages) at the 9-64-row sizes where auto takes it (twenty-fourth session):
# every llama-8b / 1b shape in Q4_K_R and Q8_0_R; the summary is each row count's best tiling summed over the shapes
step quant_gemm_sweep extra 420 'python3 -m bench.quant_gemv --no-gemv --gemm-sweep 16,64 --qtypes Q4_K_R,Q8_0_R --presets llama-8b,llama-1b --top 2' \
  'grep -A1 -E "^# M=[0-9]+, all types" $L | grep -vE "^(--)?$" | paste -sd" " | cut -c1-400'
# the batched engine's small sizes: at 2-8 rows the one-row kernel a program per row (the default since the twenty-fifth
# session) against the generic GEMV and the integer tensor-core GEMM (kernels/mmq.py, off by default); at 16-64 rows
# the fused GEMM against dequantize + cuBLAS, mmq, and (to 32) the one-row kernel a program per row (a probe past its
# 8 rows); summary: summed µs per type and M, "one-row/generic/mmq" or "fused/dequant/mmq/rows"
step quant_small_m extra 300 'python3 -m bench.quant_gemv --qtypes Q4_K_R,Q6_K_R,Q8_0_R --presets llama-8b,llama-1b --m 1,2,4,8 --prefill-m 16,32,64' \
  'awk '\''{k=$1" "$4" M"$5} $6=="gemv" {a[k]+=$7} $6=="generic" {b[k]+=$8} $6=="mmq" {q[k]+=$7} $6=="fused" {f[k]+=$8} $6=="dequant+cuBLAS" {d[k]+=$7} $6=="one-row" {r[k]+=$8} END {for (k in b) printf "%s %.0f/%.0f/%.0f; ", k, a[k], b[k], q[k]; for (k in f) printf "%s %.0f/%.0f/%.0f/%.0f; ", k, f[k], d[k], q[k], r[k]}'\'' $L | cut -c1-1200'
# Nsight Compute's counters on one llama-8b Q4_K gate/up call (the nvidia-h200 kind runs on Firecracker, where ncu reads them)
step quant_ncu extra 150 'N=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
$N --clock-control none -k regex:_q4k -c 1 --section SpeedOfLight --section Occupancy --section WarpStateStats \
  --section MemoryWorkloadAnalysis --section SchedulerStats --section SourceCounters \
  python3 -m bench.quant_gemv --once llama-8b:gate_up:Q4_K' \
  'grep -E "DRAM Throughput|Achieved Occupancy|Stall Long Scoreboard" $L | sed "s/  */ /g" | paste -sd";"'
# the one-row kernel tiles of llama-8b's shapes, CH 8 / 16 included (its Q8_0 shapes were never swept); prints TUNE lines
step quant_sweep_8b extra 480 'python3 -m bench.quant_gemv --no-gemv --sweep1 --qtypes Q4_K,Q6_K,Q8_0 --presets llama-8b --xq 2,1 --top 2' \
  'grep -cE "^\s+\(\"Q" $L | sed "s/$/ TUNE lines (see the log)/"'
# our layouts Q4_K_R / Q6_K_R / Q8_0_R (SHAPEPLAN_QUANT_REPACK) against the file's: the one-row kernel table of both, then end to end, interleaved
step quant_repack extra 540 'python3 -m bench.quant_gemv --qtypes Q4_K,Q4_K_R,Q6_K,Q6_K_R,Q8_0,Q8_0_R --m 1 --presets llama-8b --e2e llama-8b:Q4_K_M,llama-8b:Q8_0 --e2e-configs triton --repack-ab 2' \
  'grep -E "^llama-8b:Q" $L | awk '\''{printf "%s %s %s; ", $1, $2, $3}'\'' | cut -c1-480'
step quant_repack_1b extra 300 'python3 -m bench.quant_gemv --no-gemv --e2e llama-1b:Q4_K_M,llama-1b:Q8_0 --e2e-configs triton --repack-ab 2' \
  'grep -E "^llama-1b:Q" $L | awk '\''{printf "%s %s %s; ", $1, $2, $3}'\'' | cut -c1-480'
# Q5_K_M end to end (Q5_K's one-row kernel, default tiles) and Q5_K's one-row kernel against the generic GEMV (SHAPEPLAN_QUANT_ONE_ROW=0 rows)
step quant_q5 extra 480 'SHAPEPLAN_QUANT_ONE_ROW=0 python3 -m bench.quant_gemv --qtypes Q5_K --m 1 --presets llama-8b; python3 -m bench.quant_gemv --qtypes Q5_K,Q4_K --m 1 --presets llama-8b --e2e llama-1b:Q5_K_M,llama-8b:Q5_K_M --e2e-configs triton' \
  'grep -E "^llama-(1b|8b):Q5_K_M" $L | awk '\''{printf "%s %s %s; ", $1, $2, $3}'\'' | cut -c1-300'
# Q4_0, IQ4_NL, IQ4_XS: their one-row kernel (Q8_0's with nibble codes, Q8_0's tiles) against the generic GEMV on llama-8b's shapes,
# then Q4_0 and IQ4_XS files end to end
step quant_q40 extra 480 'SHAPEPLAN_QUANT_ONE_ROW=0 python3 -m bench.quant_gemv --qtypes Q4_0,IQ4_XS --m 1 --presets llama-8b; python3 -m bench.quant_gemv --qtypes Q4_0,IQ4_NL,IQ4_XS,Q8_0 --m 1 --presets llama-8b --e2e llama-1b:Q4_0,llama-1b:IQ4_XS,llama-8b:Q4_0,llama-8b:IQ4_XS --e2e-configs triton' \
  'grep -E "^llama-(1b|8b):(Q4_0|IQ4_XS)" $L | awk '\''{printf "%s %s %s; ", $1, $2, $3}'\'' | cut -c1-400'
# the one-row tiles of Q4_0 on llama-8b's and llama-1b's shapes (it borrows Q8_0's until then: qgemv.TILES_OF)
step quant_sweep_q40 extra 540 'python3 -m bench.quant_gemv --no-gemv --sweep1 --qtypes Q4_0 --presets llama-8b,llama-1b --xq 2,1 --top 2' \
  'grep -cE "^\s+\(\"Q4_0" $L | sed "s/$/ TUNE lines (see the log)/"'
# the one-row tiles of our layouts (the default for GGUF loads onto a GPU since the twentieth session) on llama-8b's and
# llama-1b's shapes (their own TUNE lines: wider code loads may want other tiles than the file layouts'), then the four
# models end to end on the swept tiles
step quant_sweep_repack extra 540 'python3 -m bench.quant_gemv --no-gemv --sweep1 --qtypes Q8_0_R,Q6_K_R,Q4_K_R --presets llama-8b,llama-1b --xq 2,1,3 --top 2 --e2e llama-1b:Q8_0,llama-8b:Q8_0,llama-1b:Q4_K_M,llama-8b:Q4_K_M --e2e-configs triton' \
  'grep -E "^llama-(1b|8b):" $L | awk '\''{printf "%s %s; ", $1, $3}'\'' | cut -c1-300'
# Q8_0's half of quant_sweep_repack, the shorter call: Q8_0_R's own one-row tiles on llama-8b's and llama-1b's shapes
# (it borrows Q8_0's: on the H200 its 8b gate/up ran at 3.01 TB/s on the tile that gives the head 4.05), then both
# Q8_0 models end to end on the swept tiles (the Q8_0 targets, 330 / 1,200, are 3 % and 7 % away)
step quant_sweep_q80 extra 480 'python3 -m bench.quant_gemv --no-gemv --sweep1 --qtypes Q8_0_R --presets llama-8b,llama-1b --xq 2,1 --top 2 --e2e llama-8b:Q8_0,llama-1b:Q8_0 --e2e-configs triton' \
  'grep -E "^llama-(1b|8b):" $L | awk '\''{printf "%s %s; ", $1, $3}'\'' | cut -c1-300'
# the short form of quant_sweep_q80 for a call with little device time left: llama-8b's shapes, int8 x only (XQ 2, which
# every 8b Q8_0 shape chose in the fourteenth session's sweep), then the 8b Q8_0 model (the 330 target) on the committed
# and the swept tiles, interleaved, two rounds (on an H100 the sweep's per-call gains did not show end to end)
step quant_sweep_q80_8b extra 420 'python3 -m bench.quant_gemv --no-gemv --sweep1 --qtypes Q8_0_R --presets llama-8b --xq 2 --top 2 --e2e llama-8b:Q8_0 --e2e-configs triton --tiles-ab 2' \
  'grep -E "^llama-8b:" $L | awk '\''{printf "%s %s %s; ", $1, $2, $3}'\'' | cut -c1-300'
# the 4- and 6-bit half of quant_sweep_repack on llama-8b's shapes only (the whole step ran out of its limit on an
# H100 after five shapes, twenty-third session): Q4_K_R with int8 x and integer dots, Q6_K_R with int8 x, then the 8b
# Q4_K_M model (both types; the 500 target) on the committed and the swept tiles, interleaved, two rounds
step quant_sweep_q4kr_8b extra 540 'python3 -m bench.quant_gemv --no-gemv --sweep1 --qtypes Q4_K_R,Q6_K_R --presets llama-8b --xq 2,3 --top 2 --e2e llama-8b:Q4_K_M --e2e-configs triton --tiles-ab 2' \
  'grep -E "^llama-8b:" $L | awk '\''{printf "%s %s %s; ", $1, $2, $3}'\'' | cut -c1-300'
# the o projection's x as codes written by the attention kernel (SHAPEPLAN_QUANT_ATTN_X, twenty-first session; first
# run on an H100 in the twenty-second): off / auto interleaved on the two llama-8b files whose o reads int8 x (1b's o reads 16-bit x)
step quant_attn_x extra 420 'python3 -m bench.quant_gemv --no-gemv --e2e llama-8b:Q8_0,llama-8b:Q4_K_M --e2e-configs triton --switch-ab SHAPEPLAN_QUANT_ATTN_X=off,auto:2' \
  'grep -E "^llama-8b" $L | awk '\''{printf "%s %s %s; ", $1, $2, $3}'\'' | cut -c1-300'
# PDL for the one-row GEMVs, off by default since the twelfth session (1b Q4_K_M 1,200 off, 1,123 on); the kernels and
# layouts have changed since, and it was never measured on Q8_0
step quant_pdl extra 480 'python3 -m bench.quant_gemv --no-gemv --e2e llama-1b:Q4_K_M,llama-1b:Q8_0,llama-8b:Q8_0 --e2e-configs triton --pdl-ab 2' \
  'grep -E "^llama-(1b|8b)" $L | awk '\''{printf "%s %s %s; ", $1, $2, $3}'\'' | cut -c1-300'
# SHAPEPLAN_QUANT_GEMV_PDL=auto (PDL on llama-8b-sized matrices only, twenty-fourth session) against off, on the llama-8b files
step quant_pdl_8b extra 420 'python3 -m bench.quant_gemv --no-gemv --e2e llama-8b:Q8_0,llama-8b:Q4_K_M --e2e-configs triton --switch-ab SHAPEPLAN_QUANT_GEMV_PDL=off,auto:2' \
  'grep -E "^llama-8b" $L | awk '\''{printf "%s %s %s; ", $1, $2, $3}'\'' | cut -c1-300'
step structured extra 300 'python3 -m bench.structured --preset llama-1b --device cuda --json $W/structured.json' \
  'awk -F"|" '\''$2 ~ /json_schema/ && $4 ~ /on/ {printf "N=%s%s tok/s (%s of unconstrained); ", $3, $5, $6}'\'' $L'
step decode_attention default 60 'python3 -m bench.decode_attention --pos 256' \
  'awk '\''/^sdpa/ {s = $4} /^BEST=/ {b = $0} END {if (b) print "sdpa " s " us/call, " b}'\'' $L'
step paged_attention default 180 'python3 -m bench.decode_attention --paged --pos 128,384' \
  'awk '\''$3=="default" {printf "D %s pos %s: %s us; ", $1, $2, $4}'\'' $L'
# the paged decode kernel's forms (thirty-fourth session; SHAPEPLAN_PAGED_EARLY, kernels/paged_jit.py): the kernel alone at
# both head dims, then llama-1b / llama-8b decode end to end with each form, interleaved
step paged_forms extra 150 'python3 -m bench.decode_attention --paged --pos 128,384 --variants 14' \
  'grep PAGED_BEST $L | tr "\n" ";"'
step decode_forms extra 420 'python3 -m bench.decode --presets llama-1b,llama-8b --configs triton --paged-forms late,early,strided:32,strided:16,strided:8 --rounds 2' \
  'grep "^paged" $L | tr -s " " | tr "\n" ";"'
# the output projection's weight asked of L2 while the attention runs (SHAPEPLAN_LLM_GEMV_PREFETCH, kernels/gemv_jit.py
# PF; on by default since the thirty-ninth session): its GPU tests, then llama-1b / llama-8b decode end to end off / on,
# alternating, two rounds
step gemv_prefetch extra 420 'python3 -m pytest -q -p no:cacheprovider tests/ops/test_fused_linear.py; for r in 1 2; do for p in 0 1; do echo "prefetch $p"; SHAPEPLAN_LLM_GEMV_PREFETCH=$p python3 -m bench.decode --presets llama-1b,llama-8b --configs triton; done; done' \
  'awk '\''/passed|failed/ {printf "%s; ", $0} $1=="prefetch" {p=$2} /^llama-(1b|8b)/ {m=$1} $1=="triton" {printf "pf %s %s %s; ", p, m, $(NF-2)}'\'' $L | cut -c1-500'
# a lone stream's decode rounds launched before the previous one is read back (SHAPEPLAN_LAUNCH_AHEAD auto, the default,
# fortieth session) against not: bf16 125m / 1b / 8b a process each, then llama-1b Q4_K_M and Q8_0 and llama-8b Q4_K_M
# alternating in one process, two rounds
step launch_ahead extra 540 'for la in off auto; do echo "launch ahead $la"; SHAPEPLAN_LAUNCH_AHEAD=$la python3 -m bench.decode --presets llama-125m,llama-1b,llama-8b --configs triton; done; python3 -m bench.quant_gemv --no-gemv --e2e llama-1b:Q4_K_M,llama-1b:Q8_0,llama-8b:Q4_K_M --e2e-configs triton --switch-ab SHAPEPLAN_LAUNCH_AHEAD=off,auto:2' \
  'awk '\''$1=="launch" {a=$3} /^llama-[0-9a-z]+ [(]/ {m=$1} $1=="triton" {printf "%s %s %s; ", a, m, $(NF-2)} $2 ~ /^triton\// {printf "%s %s %s; ", $1, $2, $3}'\'' $L | cut -c1-700'

# every round launched ahead against the default (batches synchronous) at 4 / 16 / 64 requests of llama-1b, all at once,
# after the fortieth session's fix (a request whose prefill ran after a round launched joins in a synchronous step):
# the measurement that decides whether auto covers batches too
step launch_ahead_batch extra 300 'for b in 4 16 64; do for la in off on; do echo "batch $b $la"; SHAPEPLAN_LAUNCH_AHEAD=$la python3 -m shapeplan bench --preset llama-1b --device cuda --config triton --prompt-len 128 --new-tokens 256 --batch $b; done; done' \
  'awk '\''$1=="batch" {t=$2 " " $3} $1=="shapeplan" {printf "%s: %s tok/s, TTFT p50 %s, ITL p50 %s ms; ", t, $5, $6, $8}'\'' $L | cut -c1-700'
# the same through the OpenAI server with streaming clients (requests arrive while others decode: what a round launched
# ahead costs a newcomer's time to first token), the server started off, on, off, on
LA_HTTP='for la in off on off on; do echo "launch ahead $la"; SHAPEPLAN_LAUNCH_AHEAD=$la python3 -m shapeplan serve --preset llama-1b --device cuda --mode triton --max-num-seqs 64 --max-kv-cache-length 1024 --port 8019 --log-level warning > $W/la_http_server.log 2>&1 & S=$!
for i in $(seq 900); do grep -q "^serving" $W/la_http_server.log && break; kill -0 $S 2>/dev/null || break; sleep 0.5; done
python3 -m shapeplan bench --serve http://127.0.0.1:8019 --concurrency 1,8,32,64 --prompt-len 128 --new-tokens 256; kill $S; wait $S; done'
step launch_ahead_http extra 420 "$LA_HTTP" 'awk '\''$1=="launch" {a=$3} $1 ~ /^[0-9]+$/ && NF >= 12 {printf "%s %s clients %s tok/s TTFT p50 %s ms ITL p50 %s err %s; ", a, $1, $5, $7, $9, $3}'\'' $L | cut -c1-900'
# a decode step's next token and position written straight into the decode plan's input buffers (SHAPEPLAN_DECODE_IN_PLACE,
# on by default, forty-first session) against every step's inputs copied in and outputs copied out: llama-125m and
# llama-1b a process each, alternating, two rounds; llama-1b Q4_K_M alternating in one process; 64 requests at once
step decode_in_place extra 480 'for r in 1 2; do for ip in 0 1; do echo "in place $ip"; SHAPEPLAN_DECODE_IN_PLACE=$ip python3 -m bench.decode --presets llama-125m,llama-1b --configs triton; done; done; python3 -m bench.quant_gemv --no-gemv --e2e llama-1b:Q4_K_M --e2e-configs triton --switch-ab SHAPEPLAN_DECODE_IN_PLACE=0,1:2; for ip in 0 1; do echo "batch 64 in place $ip"; SHAPEPLAN_DECODE_IN_PLACE=$ip python3 -m shapeplan bench --preset llama-1b --device cuda --config triton --prompt-len 128 --new-tokens 256 --batch 64; done' \
  'awk '\''$1=="in" {a=$3} $1=="batch" {a="b64 " $6} /^llama-[0-9a-z]+ [(]/ {m=$1} $1=="triton" {printf "%s %s %s; ", a, m, $(NF-2)} $2 ~ /^triton\// {printf "%s %s %s; ", $1, $2, $3} $1=="shapeplan" {printf "%s: %s tok/s; ", a, $5}'\'' $L | cut -c1-900'
# the same for the quantized one-row kernels (qgemv.py L2PF; with PDL, which auto gives llama-8b's matrices): their tests,
# then llama-8b Q4_K_M and Q8_0 end to end off / on, alternating in one process, two rounds
step quant_prefetch extra 420 'python3 -m pytest -q -p no:cacheprovider tests/ops/test_quant_ops.py -k prefetch; python3 -m bench.quant_gemv --no-gemv --e2e llama-8b:Q4_K_M,llama-8b:Q8_0 --e2e-configs triton --switch-ab SHAPEPLAN_LLM_GEMV_PREFETCH=0,1:2' \
  'awk '\''/passed|failed/ {printf "%s; ", $0} /^llama-8b:Q/ {printf "%s %s %s; ", $1, $2, $3}'\'' $L | cut -c1-500'
step quant_early_ab extra 480 'for e in 0 1; do echo "early $e"; SHAPEPLAN_PAGED_EARLY=$e python3 -m bench.quant_gemv --no-gemv --e2e llama-1b:Q4_K_M,llama-8b:Q4_K_M --e2e-configs triton; done' \
  'awk '\''$1=="early" {e=$2} /^llama-(1b|8b)/ {printf "early %s %s %s; ", e, $1, $3}'\'' $L | cut -c1-300'
step prefill_attention default 60 'python3 -m bench.prefill_attention' \
  'awk '\''$1==512 && $2==1024 && $3=="sdpa" {s = $8} $1==512 && $2==1024 && $3=="efficient" {e = $7}
        END {if (s e) print "512x1024 per call: sdpa " s " us, efficient " e " us"}'\'' $L'
step decode_125m extra 120 'python3 -m bench.decode --presets llama-125m --configs triton --json $W/decode_125m.json' \
  'awk '\''$1=="triton" {print "llama-125m triton late_steady " $(NF-2) " tok/s"}'\'' $L'
step decode_8b extra 240 'python3 -m bench.decode --presets llama-8b --configs triton --json $W/decode_8b.json' \
  'awk '\''$1=="triton" {print "llama-8b triton late_steady " $(NF-2) " tok/s"}'\'' $L'
step decode_vs_torch extra 300 'python3 -m bench.decode --presets llama-1b --configs cuda_graphs,triton --vs-torch-compile' \
  'awk '\''$1 ~ /^(cuda_graphs|triton|torch)/ && NF > 8 {n = $1 ($1=="torch" ? " " $2 : ""); printf "%s %s; ", n, $(NF-2)}'\'' $L'
step decode_profile extra 150 'python3 -m bench.decode --presets llama-1b --configs triton --profile 64' \
  'grep -m1 "Self CUDA time total" $L'
# where a bf16 llama-8b step goes (PDL off: the profiler serialises launches, and a PDL kernel's time would hold its
# wait); on an H100 the GEMVs ran at its copy bandwidth (thirty-first session), never profiled on an H200
step decode_profile_8b extra 240 'SHAPEPLAN_LLM_GEMV_PDL=0 python3 -m bench.decode --presets llama-8b --configs triton --profile 16' \
  'grep -m1 "Self CUDA time total" $L'
step block_stack_compile extra 150 'python3 -m bench.block_stack --shapes 1x1 --optimize' \
  'awk '\''$2=="triton" {printf "triton %s ms; ", $3} $2=="torch.compile" {printf "torch.compile %s ms; ", $4}'\'' $L'
step logits extra 240 'python3 -m bench.logits_vs_transformers --preset llama-1b --steps 256 --modes slot_by_slot,triton --json $W/logits.json' \
  'sed -n "s/^  \([a-z_]*\) *steps *[0-9]* *max|diff| \([^ ]*\) .*top-1 \([^ ]*\).*/\1 max|diff| \2 top-1 \3;/p" $L | paste -sd" "'
step onnx_light extra 240 'python3 -m bench.onnx_light_models --iters 10 --json $W/onnx_light.json' \
  'grep "all within tolerance" $L'

existing() {                               # the paths that exist; a missing one is named, not fatal
  local p; for p in "$@"; do if [ -e "$p" ]; then echo "$p"; else echo "gpu_all: no $p, left out" >&2; fi; done
}

# ---------------------------------------------------------------- arguments
BUDGET=${BUDGET_S:-570}; MODE=default; PICK=()
while [ $# -gt 0 ]; do
  case $1 in
    --quick) MODE=quick;;
    --all) MODE=all;;
    --budget) BUDGET=$2; shift;;
    --list) for i in "${!NAMES[@]}"; do printf "%-20s %-8s %4s s  %s\n" "${NAMES[$i]}" "${SETS[$i]}" "${LIMITS[$i]}" "${CMDS[$i]}"; done; exit 0;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0;;
    -*) echo "gpu_all: unknown option $1 (--quick, --all, --budget S, --list, or step names)" >&2; exit 2;;
    *) PICK+=("$1");;
  esac
  shift
done
for p in "${PICK[@]}"; do
  [[ " ${NAMES[*]} " == *" $p "* ]] || { echo "gpu_all: no step $p (see --list)" >&2; exit 2; }
done
wanted() {                                 # wanted INDEX: does this run include that step?
  local i=$1
  if [ ${#PICK[@]} -gt 0 ]; then [[ " ${PICK[*]} " == *" ${NAMES[$i]} "* ]]; return; fi
  case $MODE in
    all) true;;
    quick) [ "${SETS[$i]}" = quick ];;
    *) [ "${SETS[$i]}" != extra ];;
  esac
}

# ---------------------------------------------------------------- the machine
O=${OUT:-/tmp/gpu_all}; W=$(mktemp -d /tmp/gpu_all.XXXX); C=$W/caches; mkdir -p "$O" "$C"
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/sp_pycache}    # site-packages may be read-only
export W O GPU_TESTS QUANT_TESTS QUANT_GPU_TESTS; export -f existing     # O: where plots go ($OUT)
# the test steps compile Triton kernels for most of their time (twentieth session: two steps ran into their limits
# compiling): with pytest-xdist there (the lent machines' image has it) they compile in GPU_TEST_WORKERS processes
XDIST=""; python3 -c "import xdist" 2>/dev/null && [ "${GPU_TEST_WORKERS:-8}" -gt 1 ] && XDIST="-n ${GPU_TEST_WORKERS:-8} -p no:benchmark"   # pytest-benchmark: one warning per worker
export XDIST
T0=$(date +%s)
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm --format=csv,noheader
  echo "pytest: ${XDIST:-one process (no pytest-xdist)}"
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  if [ -d "${WHEELS:-.wheels312}" ]; then        # each package on its own: one missing wheel costs only its steps
    got=(); missing=()
    for pkg in gguf jsonschema fastapi uvicorn openai httpx prometheus-client; do
      python3 -m pip install -q --no-index --find-links "${WHEELS:-.wheels312}" "$pkg" > /dev/null 2>&1 \
        && got+=("$pkg") || missing+=("$pkg")
    done
    # the KServe tests' client, without its pins (ml_dtypes, protobuf): the machine's own stay
    python3 -m pip install -q --no-index --no-deps --find-links "${WHEELS:-.wheels312}" tritonclient python-rapidjson \
      > /dev/null 2>&1 && got+=(tritonclient) || missing+=(tritonclient)
    python3 -m pip install -q --no-index --no-deps --find-links "${WHEELS:-.wheels312}" xgrammar apache-tvm-ffi \
      > /dev/null 2>&1 && got+=(xgrammar) || missing+=(xgrammar)
    echo "wheels of ${WHEELS:-.wheels312}: installed ${got[*]:-nothing}; missing ${missing[*]:-nothing}"
  fi
  # bytecode up front, and the CUDA libraries read once, so that the first benchmark's start-up is not the
  # machine's first torch run. The lent machines set PYTHONDONTWRITEBYTECODE=1 and ship torch with no .pyc
  # at all (fourteenth session: 0 for 2,141 files), so without this every process compiles torch from
  # source (~4 s of each `import torch`); `pip install` leaves the bytecode in place on a user's machine. The standard
  # library too (forty-sixth session): under PYTHONPYCACHEPREFIX Python reads bytecode only from the prefix, so the
  # library's own __pycache__ no longer counts, and with PYTHONDONTWRITEBYTECODE nothing is added to the prefix:
  # without this, every process compiled each standard module it imported from source (174 for `import torch`,
  # 0.6-1.0 s of CPU on the dev box), inside every start-up and command timed here
  python3 -m compileall -q -j 16 shapeplan bench "$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')" \
    "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')" > /dev/null 2>&1
  echo "modules \`import torch\` compiles from source: $(python3 -v -c 'import torch' 2>&1 | grep -c '^# code object from /') here (0 expected), $(env -u PYTHONPYCACHEPREFIX python3 -v -c 'import torch' 2>&1 | grep -c '^# code object from /') in a plain process of this machine"
  python3 -c "import torch; torch.ones(1, device='cuda') @ torch.ones(1, 1, device='cuda')" 2>/dev/null \
    || echo "gpu_all: CUDA is not available here: the GPU benchmarks will say that they measured nothing"
} > "$W/machine.log" 2>&1
cat "$W/machine.log"

# ---------------------------------------------------------------- the steps
ROWS=()
for i in "${!NAMES[@]}"; do
  wanted "$i" || continue
  name=${NAMES[$i]}; L=$W/$name.log
  left=$(( BUDGET - ($(date +%s) - T0) )); lim=${LIMITS[$i]}
  if [ "$left" -lt 30 ]; then ROWS+=("$name|skipped|0|budget of $BUDGET s spent"); continue; fi
  [ "$lim" -gt "$left" ] && lim=$left
  echo "== $name (limit $lim s): ${CMDS[$i]}"
  s=$(date +%s)
  W=$W O=$O SHAPEPLAN_CACHE_DIR=$C/$name timeout -k 10 "$lim" bash -c "${CMDS[$i]}" > "$L" 2>&1
  rc=$?; dt=$(( $(date +%s) - s ))
  case $rc in 0) st=ok;; 124|137) st="TIMEOUT";; *) st="FAILED rc=$rc";; esac
  summary=$(L=$L eval "${SUMS[$i]}" 2>/dev/null | head -1 | cut -c1-150)
  [ -z "$summary" ] && summary=$(grep -v '^ *$' "$L" | tail -1 | cut -c1-150)
  tail -25 "$L"
  ROWS+=("$name|$st|$dt|$summary")
done

# ---------------------------------------------------------------- what comes back
{ cat "$W/machine.log"; for f in "$W"/*.log; do [ "$f" = "$W/machine.log" ] || { echo "== $(basename "$f" .log)"; cat "$f"; }; done; } > "$O/gpu_all.log"
python3 - "$W" "$O/results.json" <<'PY'
import glob, json, os, sys
out = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    try:
        out[os.path.basename(f)[:-5]] = json.load(open(f))
    except ValueError as e:
        out[os.path.basename(f)[:-5]] = {"error": str(e)}
json.dump(out, open(sys.argv[2], "w"), indent=1)
PY
{
  echo
  printf "%-20s %-12s %6s  %s\n" step status s result
  for r in "${ROWS[@]}"; do IFS='|' read -r n st dt sm <<< "$r"; printf "%-20s %-12s %6s  %s\n" "$n" "$st" "$dt" "$sm"; done
  echo "total $(( $(date +%s) - T0 )) s of a $BUDGET s budget; logs and JSON in $O"
} | tee "$O/summary.txt"
