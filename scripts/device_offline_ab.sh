#!/usr/bin/env bash
# One call on one H200 (.whl carried): an A/B of environment settings on Qwen3-0.6B offline.
#   source .whl/prelude.sh && ROUNDS=2 bash scripts/device_offline_ab.sh "MINISGL_FI_TENSOR_CORES=1" "MINISGL_FI_TENSOR_CORES=0"
# A throwaway first process (the first one on a fresh machine measures slow, see BENCHMARKS.md),
# then the variants alternately, ROUNDS times. Results: $OUT/offline-ab.jsonl (label = the variant).
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
m=/tmp/m
shape=${SHAPE:-qwen3-0.6b}
python3 -m minisgl_core bench make-model --shape "$shape" --out "$m/$shape" --device cuda >/dev/null
timeout 150 python3 -m minisgl_core bench offline --model "$m/$shape" --attn fi --label "warm-up (discarded)" \
  2>/dev/null | tail -n 1 | cut -c1-300
for round in $(seq "${ROUNDS:-2}"); do
  for variant in "$@"; do
    # shellcheck disable=SC2086  # the variant is VAR=value words for env
    env $variant timeout 150 python3 -m minisgl_core bench offline --model "$m/$shape" --attn fi \
      --label "$shape $variant (round $round)" --output "$out/offline-ab.jsonl" 2>>"$out/offline-ab.log" \
      | tail -n 1 | cut -c1-400
  done
done
