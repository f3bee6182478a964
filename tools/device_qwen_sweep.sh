#!/usr/bin/env bash
# One call on one H200 (.whl carried): Qwen3-0.6B offline alone on the machine, then a server and
# the online concurrency sweep on the standard workload.
#   source .whl/prelude.sh && bash tools/device_qwen_sweep.sh
set -uo pipefail
# shellcheck source=tools/_server.sh
source "$(dirname "${BASH_SOURCE[0]}")/_server.sh"
need_server_deps
out=${OUT:-/tmp/out}; mkdir -p "$out"
m=/tmp/m
python3 -m minisgl_core bench make-model --shape qwen3-0.6b --out $m/qwen3-0.6b --device cuda >/dev/null
timeout 150 python3 -m minisgl_core bench offline --model $m/qwen3-0.6b --attn fi --label qwen3-0.6b-alone \
  --output "$out/bench.jsonl" 2>"$out/qwen.log" | tail -n 1 | cut -c1-500
python3 -m minisgl_core serve --model $m/qwen3-0.6b --served-model-name bench --port 8001 --attn fi > "$out/server.log" 2>&1 &
server=$!
wait_server localhost:8001/health 120 $server "$out/server.log" || { kill $server 2>/dev/null; exit 1; }
timeout 150 python3 -m minisgl_core bench serve --url http://127.0.0.1:8001 --model bench --workload standard \
  --num-requests 128 --concurrency 16,64,128 --label "standard sweep" --output "$out/serve.jsonl" 2>/dev/null | cut -c1-600
kill $server; wait $server
