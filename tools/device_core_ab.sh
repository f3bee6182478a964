#!/usr/bin/env bash
# The core package of an earlier commit against this tree's, on the GPU, without reinstalling:
# both run with this tree's installed plugins, the earlier core first on PYTHONPATH (ahead of the
# prelude's own entries: FlashInfer lives there, and without it `--attn auto` falls back to torch). Only for
# trees whose plugins/ are identical (checked). Quicker than tools/device_before_after.sh (no
# reinstall per run), so more rounds fit in one call.
#
#   git archive COMMIT | tar -x -C .dev/before      # on the dev machine; carry .dev/before
#   source .whl/prelude.sh && ROUNDS=3 BEFORE=.dev/before bash tools/device_core_ab.sh
#
# Environment: SHAPE (default qwen3-0.6b), ATTN (default auto), ROUNDS (default 3), EXTRA (more
# `bench offline` flags for every run, e.g. "--decode-latency" or "--quantization fp8-head"), OUT, TRACE
# (default 1: the last round's runs write step traces, $OUT/steps-{before,after}.jsonl), PROFILE
# (1: the last round's runs also write cProfile reports of their timed runs' host time,
# $OUT/profile-{before,after}.txt: where a phase of the step trace spends its time). A
# discarded warm-up run first (a fresh machine's first run measures slow; it also JIT-builds
# FlashInfer/FA3), then after/before alternating. Results: $OUT/core-ab.jsonl.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
out=${OUT:-/tmp/out}; mkdir -p "$out" /tmp/m
before=$(cd "${BEFORE:?set BEFORE to the earlier tree}" && pwd)
diff -rq -x "*.egg-info" -x __pycache__ "$before/plugins" "$root/plugins" >/dev/null || { echo "plugins differ: use tools/device_before_after.sh"; exit 2; }
shape=${SHAPE:-qwen3-0.6b}; attn=${ATTN:-auto}; rounds=${ROUNDS:-3}
[ -f "/tmp/m/$shape/config.json" ] || python3 -m minisgl_core bench make-model --shape "$shape" --out "/tmp/m/$shape" \
  --device cuda >/dev/null 2>&1
run() {  # which label [trace] [profile]
  local tree=$root; [ "$1" = before ] && tree=$before
  (cd /tmp && env PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" ${3:+MINISGL_STEP_TRACE=$3} timeout 200 python3 -m minisgl_core bench offline \
    --model "/tmp/m/$shape" --attn "$attn" ${EXTRA:-} ${4:+--profile "$4"} --label "$2" --output "$out/core-ab.jsonl" 2>>"$out/core-ab.log" | tail -n 1 | cut -c1-200)
}
for tree in "$before" "$root"; do  # which core each run imports
  (cd /tmp && PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" python3 -c "import minisgl_core; print('core from', minisgl_core.__file__)")
done
run after "warm-up (discarded)" >/dev/null
for r in $(seq "$rounds"); do
  for which in after before; do
    trace=""; [ "${TRACE:-1}" = 1 ] && [ "$r" = "$rounds" ] && trace="$out/steps-$which.jsonl"
    profile=""; [ "${PROFILE:-0}" = 1 ] && [ "$r" = "$rounds" ] && profile="$out/profile-$which.txt"
    run "$which" "$shape $which r$r" "$trace" "$profile"
  done
done
