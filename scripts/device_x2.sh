#!/usr/bin/env bash
# One call on the 2-GPU machine: online benchmarks (shared-prefix radix vs naive on one GPU each,
# a concurrency sweep), then Llama-3.1-8B offline at TP=2 over NCCL. Needs .whl; run as
#   source .whl/prelude.sh && bash scripts/device_x2.sh
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
m=/tmp/m
python3 -m minisgl_core bench make-model --shape qwen3-0.6b --out $m/qwen3-0.6b --device cuda &
python3 -m minisgl_core bench make-model --shape llama-3.1-8b --out $m/llama-3.1-8b --device cuda &
wait
serve() {  # gpu port cache
  CUDA_VISIBLE_DEVICES=$1 python3 -m minisgl_core serve --model $m/qwen3-0.6b --served-model-name bench \
    --port $2 --cache $3 --attn fi > "$out/server-$3.log" 2>&1 &
}
serve 0 8001 radix; serve 1 8002 naive
for port in 8001 8002; do
  for _ in $(seq 240); do curl -sf localhost:$port/health >/dev/null && break; sleep 1; done
done
sp() { timeout 240 python3 -m minisgl_core bench serve --url http://127.0.0.1:$1 --model bench --workload shared-prefix \
         --concurrency 128 --label "shared-prefix $2" --output "$out/serve.jsonl" | tail -n 1 | cut -c1-600; }
sp 8001 radix & sp 8002 naive & wait
timeout 200 python3 -m minisgl_core bench serve --url http://127.0.0.1:8001 --model bench --workload standard \
  --num-requests 64 --concurrency 4,16,64 --label "standard sweep radix" --output "$out/serve.jsonl" | cut -c1-400
pkill -f "minisgl_core serve"; sleep 5
timeout 240 python3 -m minisgl_core bench offline --model $m/llama-3.1-8b --tp 2 --attn fi --label llama-3.1-8b-tp2 \
  --output "$out/bench.jsonl" 2>"$out/tp2.log" | tail -n 1
tail -n 5 "$out/tp2.log" | grep -i error
grep -i -m3 "error\|traceback" "$out"/server-*.log
