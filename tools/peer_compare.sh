#!/usr/bin/env bash
# minisgl side by side with mini-sglang (the peer, shared/peer) on the standard offline workload,
# in one GPU-machine call. From the repo root, .whl carried:
#
#   source .whl/prelude.sh && bash tools/peer_compare.sh [SHAPE ...]   (default: qwen3-0.6b llama-3.1-8b)
#
# Per shape: the random-weight model is built once (kept in /tmp/m while the machine stays warm),
# then our `minisgl bench offline` and the peer's bench_peer.py alternate, ROUNDS times each, each
# run a fresh process. Every run is reported, the first one of each engine included: that is the
# figure a fresh machine gives, start-up JIT and all. The table (tools/peer_table.py) follows.
#
# Time on one H100 (2026-11-25): fresh machine ~190 s before the first run (the peer's JIT), then
# per run ~95 s / ~45 s (ours, first / later: start-up JIT) and ~110 s / ~50 s (the peer) for
# Qwen3-0.6B, ~60 s and ~75 s for Llama-3.1-8B. A GPU call may run 600 s: on a fresh machine give
# it one shape (ROUNDS=2), and chain the next shape's call within the machine's idle window so the
# JIT caches and /tmp/m stay (both shapes with ROUNDS=1 ran out of time in the peer's Llama run).
# On one H200 (2026-11-27, ROUNDS=1): fresh machine 451 s for Qwen3-0.6B (129 s to ready, ours
# 150 s with its 86 s FA3 JIT now in start-up, the peer 80 s), then Llama-3.1-8B 230 s on the
# same machine. Machines went back after 30 s idle that day: chain the next call at once, or plan
# for a fresh machine; keep the inner `timeout` + the prelude under the call's 600 s.
#
# Environment:
#   ROUNDS=2            runs per engine and shape
#   ATTN=fi             our attention backend (the peer runs FlashInfer, `fi`, too)
#   OURS_FLAGS=         extra `bench offline` flags for every run of ours
#   VARIANTS=           ';'-separated extra variants of ours run after each of our runs, e.g.
#                       "--max-prefill-tokens 16384;MINISGL_X=0" (VAR=value words go to the environment)
#   TRACE=llama-3.1-8b  shapes whose runs of ours write a step trace (steps-<shape>-<n>.jsonl, packed
#                       into $OUT/steps.tgz at the end)
#   PEER_DIR            the peer folder (default: shared/peer, else ../shared/peer)
#   OUT                 results folder (default /tmp/out): peer-compare.jsonl, *.log, step traces
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
out=${OUT:-/tmp/out}
mkdir -p "$out" /tmp/m
shapes=("$@")
[ ${#shapes[@]} -gt 0 ] || shapes=(qwen3-0.6b llama-3.1-8b)
rounds=${ROUNDS:-2}
peer_dir=${PEER_DIR:-}
for d in "$root/shared/peer" "$root/../shared/peer"; do
  [ -z "$peer_dir" ] && [ -f "$d/bench_peer.py" ] && peer_dir=$(cd "$d" && pwd)
done
[ -f "${peer_dir:-/nonexistent}/bench_peer.py" ] || { echo "peer_compare: no bench_peer.py; set PEER_DIR" >&2; exit 2; }
results="$out/peer-compare.jsonl"
say() { echo "[peer_compare $(date -u +%H:%M:%S)] $*"; }

# The peer JIT-compiles FlashInfer modules our engine never builds (norm, rope, activation,
# sampling: minutes on a fresh machine). Build them while the models are written, in the
# environment run_peer.sh sets up (its PYTHON hook runs the build in place of bench_peer.py), and
# wait for them: no run is measured next to nvcc.
say "building the peer's JIT kernels (if not cached) and the models"
PYTHON="$here/_peer_jit_python.sh" bash "$peer_dir/run_peer.sh" "$root/tools/peer_jit_model" >"$out/peer-jit.log" 2>&1 &
jit_pid=$!
for shape in "${shapes[@]}"; do
  [ -f "/tmp/m/$shape/config.json" ] || python3 -m minisgl_core bench make-model --shape "$shape" \
    --out "/tmp/m/$shape" --device cuda >>"$out/make-model.log" 2>&1 || { say "make-model $shape failed"; exit 1; }
done
wait "$jit_pid" || say "peer JIT prebuild failed (the peer's first run builds them instead): $(tail -n 2 "$out/peer-jit.log")"
say "ready"

ours() {  # shape label variant-words...
  local shape=$1 label=$2; shift 2
  local envs=() flags=()
  for word in ${OURS_FLAGS:-} "$@"; do
    if [[ $word == [A-Z]*=* ]]; then envs+=("$word"); else flags+=("$word"); fi
  done
  if [[ " ${TRACE-llama-3.1-8b} " == *" $shape "* ]]; then
    envs+=("MINISGL_STEP_TRACE=$out/steps-$shape-$label.jsonl")
  fi
  say "ours $shape $label ${envs[*]} ${flags[*]}"
  env "${envs[@]}" timeout 300 python3 -m minisgl_core bench offline --model "/tmp/m/$shape" --attn "${ATTN:-fi}" \
    "${flags[@]}" --label "$shape $label $*" --output "$results" 2>>"$out/ours.log" | tail -n 1 | cut -c1-400
  # stalled decode steps (a kernel compiled mid-run showed there first): the count and the longest
  if [ -f "$out/steps-$shape-$label.jsonl" ]; then
    python3 "$here/step_trace.py" "$out/steps-$shape-$label.jsonl" | grep -A 3 "over 5x" | cut -c1-200
  fi
  # a GPU run on torch attention is no figure to compare (it happened once under --attn auto, cause unknown)
  if tail -n 1 "$results" | grep -q '"attn": "torch'; then
    say "WARNING: that run of ours used torch attention ($(grep -m 2 'no GPU' "$out/ours.log" | cut -c1-300)); plugins: $(python3 -m minisgl_core plugins 2>&1 | tr '\n' ' ' | cut -c1-600)"
  fi
}

for shape in "${shapes[@]}"; do
  for round in $(seq "$rounds"); do
    ours "$shape" "r$round"
    say "peer $shape r$round"
    timeout 300 bash "$peer_dir/run_peer.sh" "/tmp/m/$shape" >"$out/peer-$shape-r$round.log" 2>&1
    grep '^{"engine"' "$out/peer-$shape-r$round.log" | tail -n 1 | tee -a "$results" | cut -c1-400
    if [ -n "${VARIANTS:-}" ]; then
      IFS=';' read -ra variants <<<"$VARIANTS"
      for i in "${!variants[@]}"; do
        # shellcheck disable=SC2086
        ours "$shape" "r$round-v$((i + 1))" ${variants[$i]}
      done
    fi
  done
done
python3 "$here/peer_table.py" "$results" | tee "$out/peer-compare.md"
# the step traces in one archive ($OUT/steps.tgz): a GPU call brings back at most 8 files
shopt -s nullglob
traces=("$out"/steps-*.jsonl)
if [ ${#traces[@]} -gt 0 ]; then
  tar czf "$out/steps.tgz" -C "$out" "${traces[@]##*/}" && rm -f "${traces[@]}"
fi
