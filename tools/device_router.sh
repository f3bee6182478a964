#!/usr/bin/env bash
# Two minisgl workers on one GPU behind the SGLang Model Gateway (sglang-router): the shared-prefix
# workload through the router with cache-aware routing, then round robin; prints each run's
# throughput and the prefix-cache hit rate summed over both workers (read from their /metrics).
# On the GPU machine, from the tree's root, after `source .whl/prelude.sh` (the carried wheels
# must include sglang_router and its imports). ATTN (default fi), GRAPH_BS, N_GROUPS, PER_GROUP, PREFIX
# (words), OUTPUT_LEN, CONCURRENCY tune it. The load is tools/router_client.py: text prompts, since
# the gateway takes no token-id prompts.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
ATTN=${ATTN:-fi}; N_GROUPS=${N_GROUPS:-16}; PER_GROUP=${PER_GROUP:-16}; PREFIX=${PREFIX:-1024}; OUTPUT_LEN=${OUTPUT_LEN:-64}
M=/tmp/m/q
python3 -m minisgl_core bench make-model --shape qwen3-0.6b --out $M --device cuda > "$OUT/make.log" 2>&1 || exit 1
for port in 8001 8002; do
  python3 -m minisgl_core serve --model $M --attn "$ATTN" --port $port --kv-memory-fraction 0.35 \
    --cuda-graph-max-bs "${GRAPH_BS:-64}" > "$OUT/worker-$port.log" 2>&1 &
done
for port in 8001 8002; do
  for _ in $(seq 1 240); do curl -sf localhost:$port/health >/dev/null && break; sleep 1; done
  curl -sf localhost:$port/health >/dev/null || { echo "worker $port did not start"; tail -20 "$OUT/worker-$port.log"; exit 1; }
done
hits() {  # summed over both workers: admitted prompt tokens, prefix-cache hit tokens
  python3 - <<'PY'
import urllib.request
tot = {"minisgl_admitted_prompt_tokens_total": 0.0, "minisgl_prefix_cache_hit_tokens_total": 0.0}
for port in (8001, 8002):
    for line in urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode().splitlines():
        name, _, value = line.partition(" ")
        if name in tot:
            tot[name] += float(value)
print(int(tot["minisgl_admitted_prompt_tokens_total"]), int(tot["minisgl_prefix_cache_hit_tokens_total"]))
PY
}
seed=0
for policy in cache_aware round_robin; do
  seed=$((seed + 1))  # fresh prefixes per policy: the workers keep their caches between runs
  python3 -m sglang_router.launch_router --worker-urls http://127.0.0.1:8001 http://127.0.0.1:8002 \
    --policy $policy --host 127.0.0.1 --port 30000 > "$OUT/router-$policy.log" 2>&1 &
  router=$!
  for _ in $(seq 1 60); do curl -sf localhost:30000/v1/models >/dev/null && break; sleep 1; done
  read -r admitted0 hit0 < <(hits)
  python3 tools/router_client.py http://127.0.0.1:30000 q "$N_GROUPS" "$PER_GROUP" "$PREFIX" "$OUTPUT_LEN" \
    "${CONCURRENCY:-64}" "$seed" > "$OUT/bench-$policy.log" 2>&1
  echo "bench rc=$?"; tail -1 "$OUT/bench-$policy.log"
  sleep 1
  read -r admitted1 hit1 < <(hits)
  python3 -c "a=$admitted1-$admitted0; h=$hit1-$hit0; print('$policy: admitted', a, 'hit', h, 'hit rate %.4f' % (h / a if a else 0))"
  kill $router; wait $router 2>/dev/null
done
kill %1 %2 2>/dev/null; wait
