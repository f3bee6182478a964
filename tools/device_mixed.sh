#!/usr/bin/env bash
# One call on one GPU (.whl carried): mixed prefill + decode steps on vs off, served, same load.
#   source .whl/prelude.sh && bash tools/device_mixed.sh [check|serve|all]   (default all)
# check: the attention conformance kit's mixed-step test (decode rows of one token among prompt
#   chunks, in one prefill batch) on fi and fa3 (fa3 skips off sm90) against the reference, bf16;
#   success: "passed", no "failed". About 30 s after the kernels' JIT cache is warm.
# The Qwen3-0.6B shape (random weights) behind `minisgl serve` with --enable-mixed-batch, then with
# --disable-mixed-batch; each run: a short warm-up, then the standard workload (100-1024 prompt
# tokens, 100-1024 output tokens) with Poisson arrivals at RATE req/s (default 16: below
# saturation, so both variants serve the same throughput and the latencies compare), NUM
# requests (default 200). serve: about 2.5 minutes (two server start-ups with CUDA-graph capture);
# all: about 3.
# VARIANTS (default "on off"): the runs, in order; a variant may add flags after a '+', each
# separated by '+' ("on+--max-prefill-tokens=2048"); a NAME=value there sets an environment variable
# for that server instead ("on+MINISGL_SPLIT_MIXED=1"). SHAPE (llama-3.1-8b: that shape instead)
# or MODEL (a folder), SERVER_FLAGS, WORKLOAD, RATE, NUM, PY.
# Writes to $OUT: serve.jsonl (bench serve's lines), table.md, trace-summary.txt (step traces
# summarised: how many mixed steps, decode rows riding along), logs.tgz.
# Success: two rows in table.md; the "on" row shows a lower ITL p99 at about the same output tok/s,
# and trace-summary.txt shows "mixed steps" for on only.
# The same comparison on the CPU (the embedded demo model, short requests; ~3 minutes on 2 cores):
#   MODEL=demo RATE=1.5 SERVER_FLAGS="--device cpu --max-prefill-tokens 64 --num-kv-tokens 16384" \
#   WORKLOAD="--workload shared-prefix --groups 24 --prompts-per-group 1 --prefix-len 200 \
#   --question-len 8 --output-len 24" PY=.venv/bin/python bash tools/device_mixed.sh serve
set -uo pipefail
what=${1:-all}
rate=${RATE:-16}
num=${NUM:-200}
py=${PY:-python3}
out=${OUT:-/tmp/out}; mkdir -p "$out"
work=$(mktemp -d)
# shellcheck source=tools/_server.sh
source "$(dirname "${BASH_SOURCE[0]}")/_server.sh"
need_server_deps "$py"
if [[ $what == check || $what == all ]]; then
  timeout 240 $py -m pytest -q -p no:cacheprovider plugins/attention/fi/tests/test_fi_suite.py \
    plugins/attention/fa3/tests/test_fa3_suite.py -k "mixed or capabilities" 2>&1 | tail -n 5
fi
[[ $what == check ]] && exit 0
model=${MODEL:-}
if [ -z "$model" ]; then  # SHAPE (default qwen3-0.6b): a random-weight model of that shape, made once
  model=/tmp/m/${SHAPE:-qwen3-0.6b}
  [ -f "$model/config.json" ] || $py -m minisgl_core bench make-model --shape "${SHAPE:-qwen3-0.6b}" \
    --out "$model" --device cuda >/dev/null
fi
read -r -a server_flags <<< "${SERVER_FLAGS:-}"
read -r -a workload <<< "${WORKLOAD:---workload standard --num-requests $num}"
# VARIANTS="off on": the other order; "on+--max-prefill-tokens=2048": more flags for that run only
for variant in ${VARIANTS:-on off}; do
  flags=(--enable-mixed-batch)  # explicit both ways: the default depends on the device
  [ "${variant%%+*}" = off ] && flags=(--disable-mixed-batch)
  envs=()
  if [[ $variant == *+* ]]; then
    IFS=+ read -r -a more <<< "${variant#*+}"
    for m in "${more[@]}"; do
      if [[ $m =~ ^[A-Z_][A-Z0-9_]*= ]]; then envs+=("$m"); else flags+=("$m"); fi
    done
  fi
  name=${variant//[^A-Za-z0-9]/_}
  env "${envs[@]}" MINISGL_STEP_TRACE="$work/steps-$name.jsonl" $py -m minisgl_core serve --model "$model" \
    --served-model-name bench --port 8001 "${server_flags[@]}" "${flags[@]}" > "$work/server-$name.log" 2>&1 &
  server=$!
  if ! wait_server localhost:8001/health 240 $server "$work/server-$name.log"; then
    kill $server 2>/dev/null; wait $server; continue
  fi
  # warm-up on another seed: one-time work, and none of the run's prompts in the cache, stays out of the run
  $py -m minisgl_core bench serve --url http://127.0.0.1:8001 --model bench "${workload[@]}" \
    --num-requests 4 --groups 2 --concurrency 4 --seed 1 >/dev/null 2>&1
  : > "$work/steps-$name.jsonl"
  timeout 300 $py -m minisgl_core bench serve --url http://127.0.0.1:8001 --model bench \
    "${workload[@]}" --request-rate "$rate" --label "mixed $variant rate $rate" \
    --output "$out/serve.jsonl" 2>/dev/null | tail -n 1 | cut -c1-700
  kill $server; wait $server
  grep -i -m3 "error\|traceback" "$work/server-$name.log"
  {
    echo "=== mixed $variant, rate $rate req/s"
    $py tools/step_trace.py "$work/steps-$name.jsonl" --bucket 5
  } >> "$out/trace-summary.txt" 2>&1
done
[ -s "$out/serve.jsonl" ] || { echo "device_mixed.sh: no run finished (the servers' logs above)" >&2; exit 1; }
$py - "$out/serve.jsonl" > "$out/table.md" <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
print("| run | output tok/s | req/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | TPOT p50 / p99 ms |")
print("|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r.get('label')} | {r['output_tok_per_s']} | {r['req_per_s']} | {r['ttft_ms_p50']} / {r['ttft_ms_p99']} "
          f"| {r['itl_ms_p50']} / {r['itl_ms_p99']} | {r['tpot_ms_p50']} / {r['tpot_ms_p99']} |")
EOF
cat "$out/table.md"
grep -h "mixed steps\|^===\|prefill steps while" "$out/trace-summary.txt"
(cd "$work" && tar czf "$out/logs.tgz" server-*.log steps-*.jsonl)
