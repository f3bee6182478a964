#!/usr/bin/env bash
# Programmatic dependent launch (MINISGL_PDL=1, experimental) on one GPU (.whl carried):
#   source .whl/prelude.sh && bash tools/device_pdl.sh [check|ab|all|b1]
# check: with MINISGL_PDL=1 the CUDA tests of the hand-written kernels (tests/test_triton_ops.py,
#        the fp8 and Triton-decode plugins' tests) and the end-to-end bf16 check (tools/device_e2e.py:
#        every backend, graphs and overlap on/off, against the torch backend and transformers): $OUT/pdl_*.
# ab:    Llama-3.1-8B offline + batch-1 decode, MINISGL_PDL=0 against =1, bf16 then --quantization
#        fp8, alternating after a discarded first process (tools/device_offline_ab.sh):
#        $OUT/offline-ab.jsonl.
# b1:    Llama-3.1-8B --quantization fp8 batch-1 decode (--attn fi,triton, graphs up to batch 4, 4
#        requests offline first), MINISGL_PDL=0 / 1 alternating after a discarded first
#        process, ROUNDS times: $OUT/pdl-b1.jsonl.
# graphs: the default (MINISGL_PDL unset: PDL in the decode graphs of up to 8 sequences only)
#        against MINISGL_PDL=0, batch-1 decode (--attn fi,triton, 4 requests offline first, graphs
#        up to batch 8) on each of SHAPES (default "qwen3-0.6b llama-3.1-8b"; Llama in bf16 and
#        --quantization fp8-head), alternating after a discarded first process, ROUNDS (2) times:
#        $OUT/pdl-graphs.jsonl. About 8 minutes on a warm H200 with both shapes and two rounds.
set -uo pipefail
what=${1:-all}
out=${OUT:-/tmp/out}; mkdir -p "$out"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ $what == check || $what == all ]]; then
  MINISGL_PDL=1 timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_triton_ops.py \
    plugins/quantization/fp8/tests plugins/attention/triton/tests > "$out/pdl_pytest.log" 2>&1
  echo "kernel tests with MINISGL_PDL=1: exit $? ($(tail -n 1 "$out/pdl_pytest.log"))"
  MINISGL_PDL=1 timeout 300 python3 "$here/device_e2e.py" --out "$out/pdl_e2e.json" > "$out/pdl_e2e.log" 2>&1
  echo "end-to-end check with MINISGL_PDL=1: exit $?"
fi
if [[ $what == ab || $what == all ]]; then
  SHAPE=llama-3.1-8b ROUNDS=${ROUNDS:-2} bash "$here/device_offline_ab.sh" \
    "MINISGL_PDL=0 --decode-latency" "MINISGL_PDL=1 --decode-latency" \
    "MINISGL_PDL=0 --decode-latency --quantization fp8" "MINISGL_PDL=1 --decode-latency --quantization fp8"
fi
if [[ $what == b1 ]]; then
  model=/tmp/m/llama-3.1-8b
  [[ -f $model/config.json ]] || python3 -m minisgl_core bench make-model --shape llama-3.1-8b --out $model --device cpu >/dev/null
  args=(bench offline --model $model --attn fi,triton --quantization fp8 --num-requests 4 --cuda-graph-max-bs 4
        --piecewise-cuda-graph-max-tokens 0 --decode-latency)
  line() { tail -n 1 | python3 -c 'import json, sys; d = json.loads(sys.stdin.read())
print(d["label"], "init", d["init_seconds"], "s; batch-1", d["decode"]["ms_per_token"], "ms/token")'; }
  MINISGL_PDL=1 timeout 200 python3 -m minisgl_core "${args[@]}" --label "warm-up (discarded)" 2>>"$out/pdl-b1.log" | line
  for round in $(seq "${ROUNDS:-2}"); do
    for mode in 0 1; do
      MINISGL_PDL=$mode timeout 150 python3 -m minisgl_core "${args[@]}" --label "fp8 b1 MINISGL_PDL=$mode (round $round)" \
        --output "$out/pdl-b1.jsonl" 2>>"$out/pdl-b1.log" | line
    done
  done
  grep -E "Error|Traceback" "$out/pdl-b1.log" | head -5
fi
if [[ $what == graphs ]]; then
  line() { tail -n 1 | python3 -c 'import json, sys; d = json.loads(sys.stdin.read())
print(d["label"], "init", d["init_seconds"], "s; batch-1", d["decode"]["ms_per_token"], "ms/token")'; }
  for shape in ${SHAPES:-qwen3-0.6b llama-3.1-8b}; do
    model=/tmp/m/$shape
    [[ -f $model/config.json ]] || python3 -m minisgl_core bench make-model --shape "$shape" --out "$model" --device cuda >/dev/null
    quants=("")
    [[ $shape == llama* ]] && quants+=("--quantization fp8-head")
    for quant in "${quants[@]}"; do
      # shellcheck disable=SC2206  # (the quantization flag splits into its two words)
      args=(bench offline --model "$model" --attn fi,triton $quant --num-requests 4 --cuda-graph-max-bs 8
            --piecewise-cuda-graph-max-tokens 0 --decode-latency)
      env -u MINISGL_PDL timeout 200 python3 -m minisgl_core "${args[@]}" --label "$shape $quant warm-up (discarded)" \
        2>>"$out/pdl-graphs.log" | line
      for round in $(seq "${ROUNDS:-2}"); do
        env -u MINISGL_PDL timeout 150 python3 -m minisgl_core "${args[@]}" --label "$shape $quant default (round $round)" \
          --output "$out/pdl-graphs.jsonl" 2>>"$out/pdl-graphs.log" | line
        MINISGL_PDL=0 timeout 150 python3 -m minisgl_core "${args[@]}" --label "$shape $quant MINISGL_PDL=0 (round $round)" \
          --output "$out/pdl-graphs.jsonl" 2>>"$out/pdl-graphs.log" | line
      done
    done
  done
  grep -E "Error|Traceback" "$out/pdl-graphs.log" | head -5
fi
