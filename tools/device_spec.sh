#!/usr/bin/env bash
# Speculative decoding (n-gram drafts) on one GPU: batch-1 tok/s with and without, acceptance length,
# greedy agreement, on copy-heavy prompts. About 2 minutes on an H100 with a small model.
#   source .whl/prelude.sh && bash tools/device_spec.sh --model PATH      (the real default model's .gguf/dir)
#   source .whl/prelude.sh && bash tools/device_spec.sh                   (random Qwen3-0.6B-shape weights: timing only)
# Other flags go to tools/device_spec.py, e.g. --kv-cache-dtype fp8_e4m3 --quantization int8 (both runs).
# Output: one JSON line ($OUT/spec.json): plain.tok_s, ngram.tok_s, speedup, ngram.acceptance_length,
# identical_prompts / prompts (greedy agreement; bf16 may fork where logits nearly tie: first_difference).
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
model=""
extra=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --model) model=$2; shift 2 ;;
    *) extra+=("$1"); shift ;;
  esac
done
if [[ -z $model ]]; then
  model=/tmp/m/qwen3-0.6b
  python3 -m minisgl_core bench make-model --shape qwen3-0.6b --out $model --device cuda >/dev/null || exit 1
  extra+=(--ignore-eos)  # a random model's EOS comes at random: run every request to max_tokens
fi
timeout 420 python3 tools/device_spec.py --model "$model" --out "$out/spec.json" "${extra[@]}" 2>"$out/spec.log" \
  | cut -c1-3000
tail -n 5 "$out/spec.log"
