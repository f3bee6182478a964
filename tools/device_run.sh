#!/usr/bin/env bash
# One GPU-machine call: JIT the FlashInfer kernels, run the bf16 end-to-end checks, then the
# offline benchmarks with ablations. Usage (from the repo root, .whl carried):
#   source .whl/prelude.sh && bash tools/device_run.sh [checks|qwen|llama|all]
set -uo pipefail
what=${1:-all}
out=${OUT:-/tmp/out}
mkdir -p "$out"
bench() { timeout "${BENCH_TIMEOUT:-240}" python3 -m minisgl_core bench offline --output "$out/bench.jsonl" "$@" \
            2>>"$out/bench.log" | tail -n 1; }
if [[ $what == checks || $what == all ]]; then
  timeout 200 python3 tools/device_attention_check.py jit > "$out/jit.log" 2>&1; tail -n 3 "$out/jit.log"
  timeout 300 python3 tools/device_e2e.py --out "$out/e2e.json" > "$out/e2e.log" 2>&1
  echo "e2e exit $?"; grep -E '"passed"|error|Error' "$out/e2e.log" | head -20
fi
if [[ $what == qwen || $what == all ]]; then
  python3 -m minisgl_core bench make-model --shape qwen3-0.6b --out /tmp/m/qwen3-0.6b --device cuda
  bench --model /tmp/m/qwen3-0.6b --label qwen3-0.6b --attn auto
  bench --model /tmp/m/qwen3-0.6b --label qwen3-0.6b --attn fi
  bench --model /tmp/m/qwen3-0.6b --label qwen3-0.6b --attn auto --cuda-graph-max-bs 0
  bench --model /tmp/m/qwen3-0.6b --label qwen3-0.6b --attn auto --disable-overlap
  MINISGL_COMPILE=0 bench --model /tmp/m/qwen3-0.6b --label qwen3-0.6b-no-fusion --attn auto
fi
if [[ $what == llama || $what == all ]]; then
  python3 -m minisgl_core bench make-model --shape llama-3.1-8b --out /tmp/m/llama-3.1-8b --device cuda
  bench --model /tmp/m/llama-3.1-8b --label llama-3.1-8b --attn auto --decode-latency
  [[ ${LLAMA_ABLATION:-0} == 1 ]] && MINISGL_COMPILE=0 bench --model /tmp/m/llama-3.1-8b --label llama-3.1-8b-no-fusion --attn auto --decode-latency
fi
tail -n 40 "$out/bench.log" 2>/dev/null | grep -E "Error|error|Traceback" | head
