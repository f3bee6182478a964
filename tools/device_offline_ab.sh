#!/usr/bin/env bash
# One call on one H200 (.whl carried): an A/B of settings on Qwen3-0.6B (SHAPE=...) offline.
#   source .whl/prelude.sh && ROUNDS=2 bash tools/device_offline_ab.sh "MINISGL_FI_TENSOR_CORES=1" "MINISGL_FI_TENSOR_CORES=0"
#   source .whl/prelude.sh && bash tools/device_offline_ab.sh "--page-size 1" "--page-size 16 MINISGL_FI_TENSOR_CORES=0"
# A variant is words: VAR=value ones go to the environment, the others to `bench offline`.
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
    envs=(); flags=()
    for word in $variant; do
      if [[ $word == [A-Z]*=* ]]; then envs+=("$word"); else flags+=("$word"); fi
    done
    env "${envs[@]}" timeout 150 python3 -m minisgl_core bench offline --model "$m/$shape" --attn fi "${flags[@]}" \
      --label "$shape $variant (round $round)" --output "$out/offline-ab.jsonl" 2>>"$out/offline-ab.log" \
      | tail -n 1 | cut -c1-400
  done
done
