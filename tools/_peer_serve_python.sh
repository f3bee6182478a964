#!/usr/bin/env bash
# PYTHON hook for shared/peer/run_peer.sh (used by tools/peer_serve_compare.sh): every python3 call
# passes through unchanged, except bench_peer.py MODEL, in whose place mini-sglang's own server
# starts on that model, in exactly the environment run_peer.sh sets up for the peer's offline runs:
# its FlashInfer backend and radix cache (as bench_peer.py configures its LLM), port PEER_PORT.
if [[ ${1:-} == */bench_peer.py ]]; then
  exec python3 -m minisgl --model-path "$2" --port "${PEER_PORT:-1919}" --attn fi --cache-type radix
fi
exec python3 "$@"
