#!/usr/bin/env bash
# One short call on the 2-GPU machine: the fp8 GEMV's per-layer check with pick_config's launch
# (tools/device_fp8_check.py gemm: within 5% of float32 and within the bf16 output's rounding of the
# plugin's emulation; ms per layer) on GPU 0, then the two-GPU engine test of the fused all-reduce +
# norm (bitwise the unfused path; its decode sums take the in-kernel barrier).
#   source .whl/prelude.sh && bash tools/device_check_defaults.sh     (results in $OUT)
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 tools/device_fp8_check.py gemm --out "$out/fp8_gemm.json" > "$out/fp8_gemm.log" 2>&1
echo "fp8 gemm check exit $?"
python3 - "$out/fp8_gemm.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for name, row in r["gemm"]["shapes"].items():
    g = row["gemv"]["m1"]
    print(name, g["config"], "ms", g["ms_gemv"], "bf16", g["ms_bf16"], "vs emulation", g["rel_err_vs_emulation"], "ok", g["ok"])
print("passed", r["passed"])
PY
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_tensor_parallel.py -k fused_all_reduce_norm > "$out/pytest-tp.log" 2>&1
echo "two-GPU fused norm test exit $?"; tail -n 3 "$out/pytest-tp.log"
