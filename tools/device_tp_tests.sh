#!/usr/bin/env bash
# The tensor-parallel tests on CUDA, one call on the 2-GPU machine (`nvidia-h200-x2`; carry
# .dev/w2 and the extra wheels the server tests need: openai, jiter):
#   source .whl/prelude.sh && bash tools/device_tp_tests.sh
# 1. tests/server/test_tensor_parallel_server.py with MINISGL_TEST_DEVICE=cuda: live servers of
#    two NCCL ranks (the tiny model, torch attention, CUDA graphs), and the two-node tests as two
#    "nodes" on one host (rank r takes GPU r): the idle keep-alive, the settings gather, the
#    rendezvous' shape check, a killed rank, SIGTERM.
# 2. tests/test_tensor_parallel.py -k cuda (the fused all-reduce + norm bitwise the unfused path,
#    piecewise prefill graphs under TP).
# Logs: $OUT/tp-server.log, $OUT/tp-cuda.log; SERVER_TIMEOUT (default 330) and CUDA_TIMEOUT
# (default 300) bound each.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
MINISGL_TEST_DEVICE=cuda timeout "${SERVER_TIMEOUT:-330}" python3 -m pytest -q -p no:cacheprovider -p no:randomly -rfE \
  tests/server/test_tensor_parallel_server.py > "$out/tp-server.log" 2>&1
echo "server tests exit $?"; tail -n 15 "$out/tp-server.log"
timeout "${CUDA_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider -p no:randomly -rfE \
  tests/test_tensor_parallel.py -k cuda > "$out/tp-cuda.log" 2>&1
echo "cuda tests exit $?"; tail -n 5 "$out/tp-cuda.log"
