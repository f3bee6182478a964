#!/usr/bin/env bash
# The GPU conformance suites in one call, pytest processes side by side on one GPU, each under its
# own timeout so one slow suite cannot take the others' results with it:
#   triton   plugins/attention/triton
#   fi       plugins/attention/fi
#   fa3      plugins/attention/fa3
#   torch    plugins/attention/torch (its CUDA cases, and the graph protocol's test-only variant)
#   kernels  the core's Triton kernels (tests/test_triton_ops.py, test_triton_compile.py)
#   engine   the core's engine tests with CUDA cases (engine, piecewise graphs, sampler, sync, step inputs)
#   features every engine feature (speculation, float8 KV, FP8 weights, mixed steps, page size 1)
#            started and stepped under --attn auto (tests/test_gpu_features.py)
#
#   source .whl/prelude.sh && bash tools/device_suites.sh [SUITE ...]      (results in $OUT)
#
# On one H200 (2026-11-27, fresh machine, four processes side by side: the three plugins and
# test_triton_ops + test_engine): triton 158 s, fi 234 s, fa3 400 s, the core pair 410 s; 465 s of
# wall in all; `kernels engine` alone (2026-11-27, twenty-seventh session, a warm machine): 138 s and
# 240 s, 295 s of wall. Each suite's log is $OUT/<suite>.log, its exit status $OUT/<suite>.status; the
# summary lines are printed at the end. Exit status: the number of suites that did not pass.
# All six at once (the default) on a fresh machine's one GPU do not finish in 470 s (2026-11-30:
# fa3, torch and engine cut off); within one call's 600 s run them three at a time, e.g.
# `triton fi kernels`, then `engine torch fa3` (442 s on the warm machine). 2026-12-04, one H200:
# `triton features` 240 s of wall on a fresh machine (235 s and 212 s), then `engine torch fa3` 372 s
# and `fi kernels` 249 s on it warm.
# PYTHON (default python3) runs pytest; SUITE_TIMEOUT (default 450) bounds each suite.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$(dirname "$here")"
out=${OUT:-/tmp/out}; mkdir -p "$out"
limit=${SUITE_TIMEOUT:-450}
declare -A paths=(
  [triton]="plugins/attention/triton"
  [fi]="plugins/attention/fi"
  [fa3]="plugins/attention/fa3"
  [torch]="plugins/attention/torch"
  [kernels]="tests/test_triton_ops.py tests/test_triton_compile.py"
  [engine]="tests/test_engine.py tests/test_piecewise.py tests/test_sampling.py tests/test_schedule_sync.py tests/test_step_inputs.py"
  [features]="tests/test_gpu_features.py"
)
suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(triton fi fa3 torch kernels engine features)
for suite in "${suites[@]}"; do
  [ -n "${paths[$suite]:-}" ] || { echo "device_suites: unknown suite $suite (triton fi fa3 torch kernels engine features)" >&2; exit 2; }
done
for suite in "${suites[@]}"; do
  # shellcheck disable=SC2086
  (timeout "$limit" "${PYTHON:-python3}" -m pytest -q -p no:cacheprovider -p no:randomly -rfE ${paths[$suite]} \
    >"$out/$suite.log" 2>&1; echo "exit $?" >"$out/$suite.status") &
done
wait
failed=0
for suite in "${suites[@]}"; do
  status=$(cat "$out/$suite.status")
  summary=$(grep -E "^(FAILED|ERROR) |[0-9]+ (passed|failed)" "$out/$suite.log" | tail -n 6)
  echo "== $suite ($status)"; echo "$summary"
  [ "$status" = "exit 0" ] || failed=$((failed + 1))
done
exit "$failed"
