#!/usr/bin/env bash
# One call on one GPU (.whl carried): an earlier commit's core beside this tree's, served, same load.
#   git archive COMMIT | tar -x -C .dev/before      # on the dev machine; carry .dev/before
#   source .whl/prelude.sh && BEFORE=.dev/before bash tools/device_serve_ab.sh
# Each run starts `minisgl serve` importing that run's core (the earlier tree first on PYTHONPATH,
# run from /tmp so this checkout does not shadow it; the installed plugins serve both: their trees
# must be identical, checked), answers a warm-up pass (seed 1), then `bench serve` with WORKLOAD
# (default: the shared-prefix workload, 32 groups x 8) at RATE req/s (Poisson arrivals; RATE=all:
# every request sent at once), then the server stops.
# RUNS (default "before after"): the runs in order; a run may add server flags after a '+', each
# separated by '+' ("after+--disable-mixed-batch"). SHAPE (default qwen3-0.6b; a random-weight
# model of that shape, made once), SERVER_FLAGS (every run), WORKLOAD, RATE (default all), PORT
# (default 8001).
# Writes to $OUT: serve.jsonl (bench serve's lines, labelled with the run), table.md,
# trace-summary.txt (tools/step_trace.py per run), logs.tgz.
# On the CPU: MODEL=<folder> SERVER_FLAGS="--device cpu --attn torch" WORKLOAD="... short ..." with
# the venv's python first on PATH.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
# shellcheck source=tools/_server.sh
source "$here/_server.sh"
need_server_deps
out=$(mkdir -p "${OUT:-/tmp/out}" && cd "${OUT:-/tmp/out}" && pwd)
before=$(cd "${BEFORE:?set BEFORE to the earlier tree (git archive COMMIT | tar -x -C .dev/before)}" && pwd)
diff -rq -x "*.egg-info" -x __pycache__ "$before/plugins" "$root/plugins" >/dev/null || { echo "plugins differ: the installed plugins would not match the earlier core" >&2; exit 2; }
work=$(mktemp -d)
model=${MODEL:-}
if [ -z "$model" ]; then
  model=/tmp/m/${SHAPE:-qwen3-0.6b}
  [ -f "$model/config.json" ] || python3 -m minisgl_core bench make-model --shape "${SHAPE:-qwen3-0.6b}" \
    --out "$model" --device cuda >/dev/null
fi
read -r -a server_flags <<< "${SERVER_FLAGS:-}"
read -r -a workload <<< "${WORKLOAD:---workload shared-prefix --groups 32 --prompts-per-group 8}"
rate=()
port=${PORT:-8001}
[ "${RATE:-all}" != all ] && rate=(--request-rate "$RATE")
for run in ${RUNS:-before after}; do
  tree=$root; [ "${run%%+*}" = before ] && tree=$before
  more=(); [[ $run == *+* ]] && IFS=+ read -r -a more <<< "${run#*+}"
  name=${run//[^A-Za-z0-9]/_}
  (cd /tmp && PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" MINISGL_STEP_TRACE="$work/steps-$name.jsonl" \
    exec python3 -m minisgl_core serve --model "$model" --served-model-name bench --port "$port" \
    "${server_flags[@]}" "${more[@]}") > "$work/server-$name.log" 2>&1 &
  server=$!
  if ! wait_server "localhost:$port/health" 300 $server "$work/server-$name.log"; then
    kill $server 2>/dev/null; wait $server; continue
  fi
  (cd /tmp && PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" python3 -c \
    'import minisgl_core; print("core from", minisgl_core.__file__)')
  python3 -m minisgl_core bench serve --url "http://127.0.0.1:$port" --model bench "${workload[@]}" \
    --num-requests 8 --groups 2 --seed 1 >/dev/null 2>&1
  : > "$work/steps-$name.jsonl"
  timeout 300 python3 -m minisgl_core bench serve --url "http://127.0.0.1:$port" --model bench \
    "${workload[@]}" "${rate[@]}" --label "$run rate ${RATE:-all}" --output "$out/serve.jsonl" 2>/dev/null \
    | tail -n 1 | cut -c1-400
  kill $server; wait $server
  grep -i -m3 "error\|traceback" "$work/server-$name.log"
  { echo "=== $run, rate ${RATE:-all}"; python3 "$here/step_trace.py" "$work/steps-$name.jsonl" --bucket 5; } \
    >> "$out/trace-summary.txt" 2>&1
done
[ -s "$out/serve.jsonl" ] || { echo "device_serve_ab.sh: no run finished (the servers' logs above)" >&2; exit 1; }
python3 - "$out/serve.jsonl" > "$out/table.md" <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
print("| run | output tok/s | req/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | hit rate (ideal) |")
print("|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r.get('label')} | {r['output_tok_per_s']} | {r['req_per_s']} | {r['ttft_ms_p50']} / {r['ttft_ms_p99']} "
          f"| {r['itl_ms_p50']} / {r['itl_ms_p99']} | {r.get('prefix_hit_rate')} ({r.get('ideal_hit_rate')}) |")
EOF
cat "$out/table.md"
(cd "$work" && tar czf "$out/logs.tgz" server-*.log steps-*.jsonl)
