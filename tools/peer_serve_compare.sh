#!/usr/bin/env bash
# Our server and mini-sglang's (the peer, shared/peer) side by side online, in one GPU-machine call:
# the shared-prefix workload (issue 19 asks for it "if its server runs"), each server started in
# turn on the same random-weight model and measured by the same client, `minisgl bench serve`, at
# the same request rates. The peer's server takes text prompts only, so both get the prompts as
# text that the model's tokenizer encodes back to the workload's lengths (`--tokenizer`); `--server mini-sglang` speaks its
# protocol (/v1/chat/completions, one chunk per token, no usage and no /metrics: no hit rate).
#
#   source .whl/prelude.sh && bash tools/peer_serve_compare.sh [SHAPE]      (default qwen3-0.6b)
#
# Environment: RATES (default "8,16" requests/s, Poisson), WORKLOAD (default "--workload
# shared-prefix --groups 32 --prompts-per-group 8"), ATTN (ours, default auto), OURS_FLAGS (more
# `minisgl serve` flags), MODEL (a model folder instead of /tmp/m/SHAPE), PEER=0 (ours only: a dry
# run of the script on a CPU, e.g. MODEL=<tiny model> ATTN=torch OURS_FLAGS="--device cpu"),
# PEER_DIR (default shared/peer, else ../shared/peer), OUT (default /tmp/out): peer-serve.jsonl,
# the servers' and the client's logs.
# Each server first answers a discarded warm-up pass (2 groups, seed 1), then each rate runs with
# its own workload seed, so its shared prefixes are new to the cache (both servers see the same).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
out=${OUT:-/tmp/out}; mkdir -p "$out" /tmp/m
shape=${1:-qwen3-0.6b}
rates=${RATES:-8,16}
workload=${WORKLOAD:---workload shared-prefix --groups 32 --prompts-per-group 8}
peer_dir=${PEER_DIR:-}
for d in "$root/shared/peer" "$root/../shared/peer"; do
  [ -z "$peer_dir" ] && [ -f "$d/run_peer.sh" ] && peer_dir=$(cd "$d" && pwd)
done
[ -f "${peer_dir:-/nonexistent}/run_peer.sh" ] || { echo "peer_serve_compare: no run_peer.sh; set PEER_DIR" >&2; exit 2; }
results="$out/peer-serve.jsonl"
say() { echo "[peer_serve $(date -u +%H:%M:%S)] $*"; }
model=${MODEL:-/tmp/m/$shape}
with_peer=${PEER:-1}
# shellcheck source=tools/_server.sh
source "$here/_server.sh"
need_server_deps

say "building the peer's JIT kernels (if not cached) and the model"
jit_pid=
if [ "$with_peer" = 1 ]; then
  PYTHON="$here/_peer_jit_python.sh" bash "$peer_dir/run_peer.sh" "$root/tools/peer_jit_model" >"$out/peer-jit.log" 2>&1 &
  jit_pid=$!
fi
[ -f "$model/config.json" ] || python3 -m minisgl_core bench make-model --shape "$shape" --out "$model" \
  --device cuda >"$out/make-model.log" 2>&1

measure() {  # kind url label
  # a warm-up pass (seed 1), then each rate with its own seed (2, 3, ...): its prefixes new to the cache
  # shellcheck disable=SC2086
  python3 -m minisgl_core bench serve --url "$2" --server "$1" --tokenizer "$model" $workload \
    --groups 2 --prompts-per-group 4 --request-rate 16 --seed 1 >/dev/null 2>>"$out/client.log" || say "$3 warm-up failed"
  local seed=2 rate
  for rate in ${rates//,/ }; do
    # shellcheck disable=SC2086
    python3 -m minisgl_core bench serve --url "$2" --server "$1" --tokenizer "$model" $workload \
      --request-rate "$rate" --seed "$seed" --label "$3" --output "$results" 2>>"$out/client.log" | cut -c1-300
    seed=$((seed + 1))
  done
}
stop() { kill -- -"$1" 2>/dev/null || kill "$1" 2>/dev/null; sleep 3; kill -9 -- -"$1" 2>/dev/null; wait "$1" 2>/dev/null; }

say "ours: minisgl serve --attn ${ATTN:-auto}"
# shellcheck disable=SC2086
setsid python3 -m minisgl_core serve --model "$model" --port 8131 --attn "${ATTN:-auto}" ${OURS_FLAGS:-} \
  >"$out/ours-server.log" 2>&1 &
ours=$!
if wait_server http://127.0.0.1:8131/v1/models 400 "$ours" "$out/ours-server.log"; then
  measure minisgl http://127.0.0.1:8131 "minisgl $shape"
else
  say "our server did not come up (the end of its log above)"
fi
stop "$ours"

if [ "$with_peer" = 1 ]; then
  wait "$jit_pid" || say "peer JIT prebuild failed (its server builds them at start): $(tail -n 2 "$out/peer-jit.log")"
  say "peer: mini-sglang's server (fi, radix)"
  PYTHON="$here/_peer_serve_python.sh" PEER_PORT=1919 setsid bash "$peer_dir/run_peer.sh" "$model" >"$out/peer-server.log" 2>&1 &
  peer=$!
  if wait_server http://127.0.0.1:1919/v1/models 400 "$peer" "$out/peer-server.log"; then
    measure mini-sglang http://127.0.0.1:1919 "mini-sglang $shape"
  else
    say "the peer's server did not come up (the end of its log above)"
  fi
  stop "$peer"
fi

python3 - "$results" <<'PY'
import json, os, sys
if not os.path.exists(sys.argv[1]):
    sys.exit(f"peer_serve_compare: no results ({sys.argv[1]} was not written): see the logs above")
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
print("| server | req/s | output tok/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | tokens / expected (short requests) | hit rate |")
print("|---|---:|---:|---|---|---|---|")
for r in rows:
    print(f"| {r['server']} | {r['request_rate']} | {r['output_tok_per_s']:,} | {r['ttft_ms_p50']} / {r['ttft_ms_p99']} "
          f"| {r['itl_ms_p50']} / {r['itl_ms_p99']} | {r['output_tokens']} / {r['expected_output_tokens']} ({r.get('short_requests')}) "
          f"| {r['prefix_hit_rate']} |")
for r in rows:  # our server counts the prompt tokens it received: text prompts must not grow
    served, sent = r.get("prompt_tokens_served"), r.get("prompt_tokens")
    if served is not None and served != sent:
        print(f"WARNING: {r['server']} at {r['request_rate']} req/s received {served:,} prompt tokens, "
              f"the workload has {sent:,}: the text prompts did not encode back to the workload's lengths")
PY
