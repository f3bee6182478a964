#!/usr/bin/env bash
# Programmatic dependent launch (MINISGL_PDL=1, experimental) on one GPU (.whl carried):
#   source .whl/prelude.sh && bash tools/device_pdl.sh [check|ab|all]
# check: with MINISGL_PDL=1 the CUDA tests of the hand-written kernels (tests/test_triton_ops.py,
#        the fp8 plugin's tests) and the end-to-end bf16 check (tools/device_e2e.py: every backend,
#        graphs and overlap on/off, against the torch backend and transformers): $OUT/pdl_*.
# ab:    Llama-3.1-8B offline + batch-1 decode, MINISGL_PDL=0 against =1, bf16 then --quantization
#        fp8, alternating after a discarded first process (tools/device_offline_ab.sh):
#        $OUT/offline-ab.jsonl.
set -uo pipefail
what=${1:-all}
out=${OUT:-/tmp/out}; mkdir -p "$out"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ $what == check || $what == all ]]; then
  MINISGL_PDL=1 timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_triton_ops.py \
    plugins/quantization/fp8/tests > "$out/pdl_pytest.log" 2>&1
  echo "kernel tests with MINISGL_PDL=1: exit $? ($(tail -n 1 "$out/pdl_pytest.log"))"
  MINISGL_PDL=1 timeout 300 python3 "$here/device_e2e.py" --out "$out/pdl_e2e.json" > "$out/pdl_e2e.log" 2>&1
  echo "end-to-end check with MINISGL_PDL=1: exit $?"
fi
if [[ $what == ab || $what == all ]]; then
  SHAPE=llama-3.1-8b ROUNDS=${ROUNDS:-2} bash "$here/device_offline_ab.sh" \
    "MINISGL_PDL=0 --decode-latency" "MINISGL_PDL=1 --decode-latency" \
    "MINISGL_PDL=0 --decode-latency --quantization fp8" "MINISGL_PDL=1 --decode-latency --quantization fp8"
fi
