#!/usr/bin/env bash
# One call on the 2-GPU machine (`nvidia-h200-x2`, .whl carried) after a fast-path change:
#   source .whl/prelude.sh && bash tools/device_x2_measure.sh [all|bench]
# decode kernel variants; then GPU0: Qwen3-0.6B offline (+ tensor-core decode ablation) and the fi
# attention conformance suite, GPU1 meanwhile: Llama-3.1-8B offline TP=1 with batch-1 decode and
# the bf16 end-to-end checks; last, Llama-3.1-8B offline at TP=2 (NCCL). Logs: $OUT/logs.tar.gz.
# "bench" runs only the three benchmarks (no kernel variants, suite, e2e or ablation).
set -uo pipefail
what=${1:-all}
out=${OUT:-/tmp/out}; logs=/tmp/logs; mkdir -p "$out" $logs
m=/tmp/m
bench() { timeout 200 python3 -m minisgl_core bench offline --attn fi --output "$out/bench.jsonl" "$@" | tail -n 1 | cut -c1-500; }
python3 -m minisgl_core bench make-model --shape qwen3-0.6b --out $m/qwen3-0.6b --device cuda:0 >/dev/null &
CUDA_VISIBLE_DEVICES=1 python3 -m minisgl_core bench make-model --shape llama-3.1-8b --out $m/llama-3.1-8b --device cuda >/dev/null &
[[ $what == all ]] && CUDA_VISIBLE_DEVICES=0 timeout 150 python3 tools/device_profile.py attn --json "$out/attn.json" > $logs/attn.log 2>&1; echo "attn exit $?"
wait
(export CUDA_VISIBLE_DEVICES=0
 bench --model $m/qwen3-0.6b --label qwen3-0.6b 2>$logs/qwen.log
 [[ $what == all ]] || exit 0
 MINISGL_FI_TENSOR_CORES=0 bench --model $m/qwen3-0.6b --label qwen3-0.6b-cuda-core-decode 2>$logs/qwen-cc.log
 timeout 120 python3 -m pytest plugins/attention/fi -q -x -p no:cacheprovider > $logs/fi-suite.log 2>&1; echo "fi suite exit $?"; tail -n 2 $logs/fi-suite.log) &
(export CUDA_VISIBLE_DEVICES=1
 bench --model $m/llama-3.1-8b --label llama-3.1-8b-tp1 --decode-latency 2>$logs/llama.log
 [[ $what == all ]] || exit 0
 timeout 200 python3 tools/device_e2e.py --configs torch_bf16,fi,fi_no_graph,fi_cuda_core_decode --out "$out/e2e.json" > $logs/e2e.log 2>&1
 echo "e2e exit $?") &
wait
bench --model $m/llama-3.1-8b --tp 2 --label llama-3.1-8b-tp2 2>$logs/tp2.log
grep -i -m5 "error\|traceback" $logs/*.log
tar -czf "$out/logs.tar.gz" -C /tmp logs
