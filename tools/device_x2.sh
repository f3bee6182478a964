#!/usr/bin/env bash
# One call on the 2-GPU machine (`nvidia-h200-x2`, .whl carried):
#   source .whl/prelude.sh && bash tools/device_x2.sh [tp|serve|all]
# tp:    Llama-3.1-8B offline at TP=1 and TP=2 (NCCL) on the same machine, the ratio the target asks for.
# serve: shared-prefix radix vs naive (one server per GPU), then a short concurrency sweep.
# The TP step comes first: the first attempt (2026-11-20) ran out of time in the sweep before reaching it.
set -uo pipefail
what=${1:-all}
out=${OUT:-/tmp/out}; mkdir -p "$out"
m=/tmp/m
if [[ $what == tp || $what == all ]]; then
  python3 -m minisgl_core bench make-model --shape llama-3.1-8b --out $m/llama-3.1-8b --device cuda
  for tp in 1 2; do
    timeout 240 python3 -m minisgl_core bench offline --model $m/llama-3.1-8b --tp $tp --attn fi \
      --label llama-3.1-8b-tp$tp --output "$out/bench.jsonl" 2>"$out/tp$tp.log" | tail -n 1 | cut -c1-400
    grep -i -m3 "error\|traceback" "$out/tp$tp.log"
  done
fi
if [[ $what == serve || $what == all ]]; then
  python3 -m minisgl_core bench make-model --shape qwen3-0.6b --out $m/qwen3-0.6b --device cuda
  serve() {  # gpu port cache
    CUDA_VISIBLE_DEVICES=$1 python3 -m minisgl_core serve --model $m/qwen3-0.6b --served-model-name bench \
      --port $2 --cache $3 --attn fi > "$out/server-$3.log" 2>&1 &
  }
  serve 0 8001 radix; serve 1 8002 naive
  for port in 8001 8002; do
    for _ in $(seq 240); do curl -sf localhost:$port/health >/dev/null && break; sleep 1; done
  done
  sp() { timeout 150 python3 -m minisgl_core bench serve --url http://127.0.0.1:$1 --model bench --workload shared-prefix \
           --concurrency 128 --label "shared-prefix $2" --output "$out/serve.jsonl" 2>/dev/null | tail -n 1 | cut -c1-600; }
  # wait for the two clients only: a bare `wait` would also wait for the servers, i.e. forever
  sp 8001 radix & c1=$!; sp 8002 naive & c2=$!; wait $c1 $c2
  timeout 120 python3 -m minisgl_core bench serve --url http://127.0.0.1:8001 --model bench --workload standard \
    --num-requests 64 --concurrency 16,64 --label "standard sweep radix" --output "$out/serve.jsonl" 2>/dev/null | cut -c1-400
  pkill -f "minisgl_core serve"; sleep 3
  grep -i -m3 "error\|traceback" "$out"/server-*.log
fi
