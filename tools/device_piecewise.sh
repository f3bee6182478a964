#!/usr/bin/env bash
# Piecewise CUDA graphs of prefill steps (runner/piecewise.py) on one GPU (.whl carried):
#   source .whl/prelude.sh && bash tools/device_piecewise.sh [check|host|serve|all]   (default all)
# check: tests/test_piecewise.py (graphs against the eager forward; whole runs on and off).
# host:  tools/device_prefill_host.py on the Qwen3-0.6B shape, prefill graphs on (2048) and off (0),
#        plain prefill steps and mixed ones (--mixed): host ms per prefill forward.
# serve: tools/device_mixed.sh serve with and without the graphs (mixed on and off each):
#        TTFT / ITL at RATE req/s (default 16), the standard workload.
# offline: `bench offline` (the standard workload) with the graphs on and off, alternating, on the
#        SHAPES (default qwen3-0.6b); offline.jsonl, offline-*.log (start-up lines: capture times).
# Results under $OUT: pytest.log, host-*.json/.txt, serve.jsonl, table.md, trace-summary.txt.
set -uo pipefail
what=${1:-all}
py=${PY:-python3}
out=${OUT:-/tmp/out}; mkdir -p "$out"
attn=${ATTN:-auto}
if [[ $what == check || $what == all ]]; then
  timeout 400 $py -m pytest -q -p no:cacheprovider tests/test_piecewise.py > "$out/pytest.log" 2>&1
  tail -n 15 "$out/pytest.log"
fi
model=/tmp/m/qwen3-0.6b
[ -d $model ] || $py -m minisgl_core bench make-model --shape qwen3-0.6b --out $model --device cuda >/dev/null
if [[ $what == host || $what == all ]]; then
  for mixed in "" "--mixed"; do
    for pw in ${PIECEWISE:-2048 0}; do
      tag="pw$pw${mixed:+-mixed}"
      timeout 240 $py tools/device_prefill_host.py $model --attn "$attn" $mixed --piecewise "$pw" \
        --json "$out/host-$tag.json" > "$out/host-$tag.txt" 2>&1
      echo "== $tag"; grep -v "^\[" "$out/host-$tag.json" 2>/dev/null | tr -d '\n '; echo
      grep -m2 "piecewise\|Traceback" "$out/host-$tag.txt"
    done
  done
fi
if [[ $what == serve || $what == all ]]; then
  for pw in ${PIECEWISE:-2048 0}; do
    OUT="$out/serve-pw$pw" SERVER_FLAGS="--attn $attn --piecewise-cuda-graph-max-tokens $pw" MODEL=$model \
      PY=$py bash tools/device_mixed.sh serve
  done
fi
if [[ $what == offline ]]; then
  for shape in ${SHAPES:-qwen3-0.6b}; do
    m=/tmp/m/$shape
    [ -d $m ] || $py -m minisgl_core bench make-model --shape $shape --out $m --device cuda >/dev/null
    for pw in ${PIECEWISE:-2048 0}; do
      timeout ${BENCH_TIMEOUT:-200} $py -m minisgl_core bench offline --model $m --attn "$attn" \
        --piecewise-cuda-graph-max-tokens $pw --label "$shape piecewise $pw" --output "$out/offline.jsonl" \
        > "$out/offline-$shape-pw$pw.log" 2>&1
      echo "== $shape pw$pw"; grep -h "captured\|Traceback\|Error" "$out/offline-$shape-pw$pw.log" | cut -c1-200
      tail -n 1 "$out/offline.jsonl" | cut -c1-400
    done
  done
fi
