#!/usr/bin/env bash
# One call on one GPU (.whl carried), about 3 minutes: the one-request-path branch (issue 17) on
# the GPU. 1) the engine's admission / prefix-match / retraction tests and the wire tests, on the
# CUDA machine's interpreter; 2) Qwen3-0.6B offline (`bench offline --attn fi`, a discarded first
# process then ROUNDS runs) to compare with the same script run on the commit before (same call,
# same machine: the per-step path changed only by an O(1) check and an empty list per message).
#   source .whl/prelude.sh && bash tools/device_onepath.sh
# Results: $OUT/onepath-tests.txt (pytest's summary), $OUT/onepath-offline.jsonl (one line per run).
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
m=/tmp/m
shape=${SHAPE:-qwen3-0.6b}
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_one_request_path.py tests/server/test_messages.py \
  tests/test_environment.py 2>&1 | tail -n 5 | tee "$out/onepath-tests.txt"
python3 -m minisgl_core bench make-model --shape "$shape" --out "$m/$shape" --device cuda >/dev/null
timeout 150 python3 -m minisgl_core bench offline --model "$m/$shape" --attn fi --label "warm-up (discarded)" \
  2>/dev/null | tail -n 1 | cut -c1-300
for round in $(seq "${ROUNDS:-2}"); do
  timeout 150 python3 -m minisgl_core bench offline --model "$m/$shape" --attn fi \
    --label "$shape onepath (round $round)" --output "$out/onepath-offline.jsonl" 2>>"$out/onepath-offline.log" \
    | tail -n 1 | cut -c1-400
done
