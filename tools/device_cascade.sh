#!/usr/bin/env bash
# One call on one H200 (.whl carried): cascade attention on the GPU.
#   source .whl/prelude.sh && bash tools/device_cascade.sh [check|serve|offline|all]
# check:   the fi conformance tests of cascade decode (eager and CUDA-graph replay), bf16
# serve:   the shared-prefix workload against radix (cascade on), radix --disable-cascade, naive,
#          one server after the other on the same GPU
# offline: Qwen3-0.6B standard offline workload (no shared prefixes: cascade must cost nothing)
# CONCURRENCY (default 128) sets the serve client's concurrency.
set -uo pipefail
# shellcheck source=tools/_server.sh
source "$(dirname "${BASH_SOURCE[0]}")/_server.sh"
need_server_deps
conc=${CONCURRENCY:-128}
what=${1:-all}
out=${OUT:-/tmp/out}; mkdir -p "$out"
m=/tmp/m
if [[ $what == check || $what == all ]]; then
  timeout 300 python3 -m pytest -q -x -p no:cacheprovider plugins/attention/fi/tests/test_fi_suite.py -k cascade \
    2>&1 | tail -n 15
fi
if [[ $what == serve || $what == offline || $what == all ]]; then
  python3 -m minisgl_core bench make-model --shape qwen3-0.6b --out $m/qwen3-0.6b --device cuda >/dev/null
fi
if [[ $what == offline || $what == all ]]; then
  timeout 150 python3 -m minisgl_core bench offline --model $m/qwen3-0.6b --attn fi --label qwen3-0.6b \
    --output "$out/bench.jsonl" 2>"$out/server-offline.log" | tail -n 1 | cut -c1-400
fi
if [[ $what == serve || $what == all ]]; then
  for variant in "radix" "radix --disable-cascade" "naive"; do
    label=${variant// /_}
    # shellcheck disable=SC2086  # the variant's words are separate flags
    python3 -m minisgl_core serve --model $m/qwen3-0.6b --served-model-name bench --port 8001 --attn fi \
      --cache $variant > "$out/server-$label.log" 2>&1 &
    server=$!
    wait_server localhost:8001/health 240 $server "$out/server-$label.log" || { kill $server 2>/dev/null; wait $server; continue; }
    timeout 150 python3 -m minisgl_core bench serve --url http://127.0.0.1:8001 --model bench \
      --workload shared-prefix --concurrency "$conc" --label "shared-prefix $label c$conc" --output "$out/serve.jsonl" \
      2>/dev/null | tail -n 1 | cut -c1-600
    kill $server; wait $server
    grep -i -m3 "error\|traceback" "$out/server-$label.log"
  done
fi
if ls "$out"/server-*.log >/dev/null 2>&1; then
  (cd "$out" && tar czf logs.tgz server-*.log && rm server-*.log)
fi
