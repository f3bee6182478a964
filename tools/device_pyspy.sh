#!/usr/bin/env bash
# One call on one GPU (.whl carried, and a py-spy binary at $PYSPY): where the scheduler's main
# thread spends a constrained run (issue 18). The Qwen3-0.6B shape, standard offline workload,
# `bench offline --attn fi`, each run a fresh process sampled by py-spy (200 Hz, --nonblocking so
# the process is never paused, --idle so waits count, every thread): free, constrained, and
# constrained with EXTRA_FLAGS (default `--grammar-threads 4`). Each run also writes its step trace.
#   source .whl/prelude.sh && PYSPY=.dev/pyspy/py-spy bash tools/device_pyspy.sh
# Results: $OUT/pyspy-{free,constrained,variant}.txt.gz (py-spy's raw collapsed stacks; read them
# with `python3 tools/pyspy_summary.py FILE`), $OUT/pyspy-offline.jsonl, steps-*.txt.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
m=/tmp/m; shape=qwen3-0.6b; pyspy=${PYSPY:-py-spy}
chmod +x "$pyspy"
python3 -m minisgl_core bench make-model --shape "$shape" --out "$m/$shape" --device cuda >/dev/null
# a discarded run first: FlashInfer's JIT and the compile caches belong to no measured run
timeout 150 python3 -m minisgl_core bench offline --model "$m/$shape" --attn fi --label warm-up \
  --grammar-schema builtin 2>"$out/warm-up.log" | tail -n 1 | cut -c1-200
run() {  # run NAME LABEL [flags...]
  local name=$1 label=$2; shift 2
  timeout 150 "$pyspy" record --nonblocking --idle --threads --subprocesses -r 200 -f raw -o "/tmp/pyspy-$name.txt" -- \
    python3 -m minisgl_core bench offline --model "$m/$shape" --attn fi --label "$label" \
    --step-trace "/tmp/steps-$name.jsonl" --output "$out/pyspy-offline.jsonl" "$@" \
    2>>"$out/pyspy.log" | tail -n 1 | cut -c1-300
  gzip -c "/tmp/pyspy-$name.txt" > "$out/pyspy-$name.txt.gz"
  python3 tools/step_trace.py "/tmp/steps-$name.jsonl" > "$out/steps-$name.txt" 2>&1
}
run free "free (py-spy)"
run constrained "constrained xgrammar (py-spy)" --grammar-schema builtin
# shellcheck disable=SC2086
run variant "constrained xgrammar ${EXTRA_FLAGS:---grammar-threads 4} (py-spy)" --grammar-schema builtin ${EXTRA_FLAGS:---grammar-threads 4}
