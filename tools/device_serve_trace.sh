#!/usr/bin/env bash
# One call on one H200 (.whl carried): the shared-prefix workload through the server, traced.
#   source .whl/prelude.sh && bash tools/device_serve_trace.sh [CACHE ...]   (default: radix naive)
# For each cache variant (words after the cache name are more server flags, e.g. "radix --disable-cascade"):
# a server with MINISGL_STEP_TRACE, `bench serve --trace` at CONCURRENCY (default 256), the CPU
# seconds each server process used during the run, and tools/step_trace.py's summary.
# Writes to $OUT: serve.jsonl, trace-summary.txt, traces.tgz (raw traces), logs.tgz.
set -uo pipefail
# shellcheck source=tools/_server.sh
source "$(dirname "${BASH_SOURCE[0]}")/_server.sh"
need_server_deps
conc=${CONCURRENCY:-256}
out=${OUT:-/tmp/out}; mkdir -p "$out"
work=$(mktemp -d)
m=/tmp/m
python3 -m minisgl_core bench make-model --shape qwen3-0.6b --out $m/qwen3-0.6b --device cuda >/dev/null
[ $# -eq 0 ] && set -- radix naive
cpu() {  # "role utime+stime" (clock ticks): the launcher (API server), then its children in spawn order
  local roles=(tokenizer detokenizer scheduler0) i=0 p
  echo "api $(awk '{print $14+$15}' /proc/"$1"/stat)"
  for p in $(pgrep -P "$1" | sort -n); do
    grep -q resource_tracker /proc/"$p"/cmdline && continue
    echo "${roles[i]:-child$i} $(awk '{print $14+$15}' /proc/"$p"/stat)"; i=$((i + 1))
  done
}
for variant in "$@"; do
  label="${variant// /_}-c$conc"
  # shellcheck disable=SC2086  # the variant's words are separate flags
  MINISGL_STEP_TRACE="$work/steps-$label.jsonl" python3 -m minisgl_core serve --model $m/qwen3-0.6b \
    --served-model-name bench --port 8001 --attn fi --cache $variant > "$work/server-$label.log" 2>&1 &
  server=$!
  wait_server localhost:8001/health 300 $server "$work/server-$label.log" || { kill $server 2>/dev/null; wait $server; continue; }
  # a short warm-up so the first wave does not pay for one-time work (JIT, first allocations)
  # (the standard workload: its random prompts share nothing with the shared-prefix prompts)
  python3 -m minisgl_core bench serve --url http://127.0.0.1:8001 --model bench --workload standard \
    --num-requests 8 --concurrency 8 >/dev/null 2>&1
  : > "$work/steps-$label.jsonl"
  cpu $server > "$work/cpu0"
  timeout 200 python3 -m minisgl_core bench serve --url http://127.0.0.1:8001 --model bench \
    --workload shared-prefix --concurrency "$conc" --label "shared-prefix $variant c$conc" \
    --output "$out/serve.jsonl" --trace "$work/requests-$label.jsonl" 2>/dev/null | tail -n 1 | cut -c1-700
  cpu $server > "$work/cpu1"
  {
    echo "=== $variant, concurrency $conc"
    echo "CPU seconds per server process during the run:"
    paste "$work/cpu0" "$work/cpu1" | awk '{printf "  %-12s %6.2f s\n", $1, ($4 - $2) / 100}'
    python3 tools/step_trace.py "$work/steps-$label.jsonl" --requests "$work/requests-$label.jsonl" --bucket 1
  } >> "$out/trace-summary.txt" 2>&1
  kill $server; wait $server
  grep -i -m3 "error\|traceback" "$work/server-$label.log"
done
(cd "$work" && tar czf "$out/traces.tgz" steps-*.jsonl requests-*.jsonl && tar czf "$out/logs.tgz" server-*.log)
tail -n 80 "$out/trace-summary.txt"
