#!/usr/bin/env bash
# One call on the 2-GPU machine (`nvidia-h200-x2`, .whl carried) that measures where time goes and TP:
#   source .whl/prelude.sh && bash tools/device_profile.sh
# 1. decode kernel variants (tools/device_profile.py attn; also JITs the head_dim-128 kernels);
# 2. GPU0: per-step profile of the Qwen3-0.6B offline workload, then batch-1 Llama-3.1-8B decode;
#    GPU1 meanwhile: Llama-3.1-8B offline at TP=1;
# 3. Llama-3.1-8B offline at TP=2 (NCCL) over both GPUs.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
m=/tmp/m
python3 -m minisgl_core bench make-model --shape qwen3-0.6b --out $m/qwen3-0.6b --device cuda:0 >/dev/null &
CUDA_VISIBLE_DEVICES=1 python3 -m minisgl_core bench make-model --shape llama-3.1-8b --out $m/llama-3.1-8b --device cuda >/dev/null &
timeout 150 python3 tools/device_profile.py attn --json "$out/attn.json" > "$out/attn.log" 2>&1; echo "attn exit $?"
wait
(CUDA_VISIBLE_DEVICES=0 timeout 200 python3 tools/device_profile.py steps $m/qwen3-0.6b --json "$out/steps.json" > "$out/steps.log" 2>&1; echo "steps exit $?"
 CUDA_VISIBLE_DEVICES=0 timeout 150 python3 tools/device_profile.py b1 $m/llama-3.1-8b --json "$out/b1.json" > "$out/b1.log" 2>&1; echo "b1 exit $?") &
CUDA_VISIBLE_DEVICES=1 timeout 200 python3 -m minisgl_core bench offline --model $m/llama-3.1-8b --attn fi \
  --label llama-3.1-8b-tp1 --output "$out/bench.jsonl" 2>"$out/tp1.log" | tail -n 1 | cut -c1-400
wait
timeout 240 python3 -m minisgl_core bench offline --model $m/llama-3.1-8b --tp 2 --attn fi \
  --label llama-3.1-8b-tp2 --output "$out/bench.jsonl" 2>"$out/tp2.log" | tail -n 1 | cut -c1-400
grep -i -m5 "error\|traceback" "$out"/*.log
