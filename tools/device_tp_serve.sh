#!/usr/bin/env bash
# Tensor-parallel serving, an earlier tree against this one, in one call on the 2-GPU machine
# (`nvidia-h200-x2`, .whl carried): `minisgl serve --tp 2` on the Llama-3.1-8B shape (random
# weights), the standard workload through the server at a fixed concurrency, every run reported.
#
#   source .whl/prelude.sh && BEFORE=.dev/before bash tools/device_tp_serve.sh
#
# BEFORE is a plain tree of the earlier commit (`git archive COMMIT | tar -x -C .dev/before`,
# carried); each run first reinstalls that tree's packages (as tools/device_before_after.sh does).
# About 110 s a run on a fresh H200 pair (the first run pays FlashInfer's JIT): keep TREES to three runs
# within one 600 s call. Environment: TREES (default "after before after"), CONCURRENCY (default 128), NUM (default
# 256), OUT. Output: $OUT/tp-serve.jsonl (`bench serve` lines), $OUT/tp-serve-logs.tgz.
set -uo pipefail
# shellcheck source=tools/_server.sh
source "$(dirname "${BASH_SOURCE[0]}")/_server.sh"
need_server_deps
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
out=${OUT:-/tmp/out}; logs=/tmp/tp-serve-logs; mkdir -p "$out" $logs /tmp/m
before=$(cd "${BEFORE:?set BEFORE to the earlier tree}" && pwd)
model=/tmp/m/llama-3.1-8b
[ -f $model/config.json ] || python3 -m minisgl_core bench make-model --shape llama-3.1-8b --out $model --device cuda >/dev/null
source "$here/_use_tree.sh"
n=0
for tree in ${TREES:-after before after}; do
  n=$((n + 1))
  dir=$root; [ "$tree" = before ] && dir=$before
  use_tree "$dir"
  (cd "$dir" && exec python3 -m minisgl_core serve --model $model --served-model-name bench --tp 2 --attn fi \
     --port 8001) > $logs/server-$n-$tree.log 2>&1 &
  server=$!
  wait_server localhost:8001/health 300 $server $logs/server-$n-$tree.log || { kill $server 2>/dev/null; wait $server; continue; }
  python3 -m minisgl_core bench serve --url http://127.0.0.1:8001 --model bench --workload standard \
    --num-requests 8 --concurrency 8 >/dev/null 2>&1  # warm-up
  timeout 240 python3 -m minisgl_core bench serve --url http://127.0.0.1:8001 --model bench --workload standard \
    --num-requests "${NUM:-256}" --concurrency "${CONCURRENCY:-128}" --label "tp2 serve $tree" \
    --output "$out/tp-serve.jsonl" 2>>$logs/client.log | tail -n 1 | cut -c1-400
  kill $server; wait $server 2>/dev/null
  grep -i -m3 "error\|traceback" $logs/server-$n-$tree.log
  tar -czf "$out/tp-serve-logs.tgz" -C /tmp tp-serve-logs  # after every run: the call may end first
done
use_tree "$root"
