#!/usr/bin/env bash
# FP8 on Hopper, one GPU call (about 5 minutes on an H200; `checks` alone about 1.5):
#   checks: the fp8 plugin's tests on CUDA (torch._scaled_mm vs its emulation, the conformance
#           suite in bf16), then tools/device_fp8_check.py (GEMM accuracy and speed on
#           Llama-3.1-8B's layer shapes; fp8 weights / fp8 KV end to end against float32)
#   bench:  Llama-3.1-8B shape (random weights) offline and batch-1 decode, bf16 vs
#           --quantization fp8 vs fp8 + --kv-cache-dtype fp8_e4m3 (bound: ~1.6 ms/token on H200)
#   gemv:   the GEMV's launch sweep (tools/device_gemv_sweep.py $SWEEP_ARGS, weights from HBM:
#           $OUT/gemv-sweep.json), then batch-1 decode (4 requests offline, then --decode-latency)
#           with --quantization fp8: pick_config's choice, the same with the row rounded in
#           arithmetic (hw_round off) and the sweep's (tools/fp8_tuned_run.py) alternating, ROUNDS (2) times
#   head:   the fp8 plugin's CUDA tests (fp8-head's conformance among them), then Llama-3.1-8B
#           batch-1 decode (--attn fi,triton, 4 requests offline first) with --quantization fp8
#           and fp8-head alternating after a discarded first process, ROUNDS (2) times:
#           $OUT/fp8_head_b1.jsonl; then the offline workload (--attn auto) fp8-head, fp8 while time lasts
#   pdlhead: Llama-3.1-8B batch-1 decode as in `head` with --quantization fp8-head only, MINISGL_PDL=0
#           and =1 alternating after a discarded first process, ROUNDS (2) times: $OUT/fp8_pdl_b1.jsonl
# Usage (repo root, .whl carried): source .whl/prelude.sh && bash tools/device_fp8.sh [checks|bench|all|gemv|head|pdlhead]
# Success: "fp8 check passed: True" and three JSON lines whose output_throughput / ms_per_token
# go up / down from the bf16 line to the fp8 ones.
set -uo pipefail
what=${1:-all}
out=${OUT:-/tmp/out}
mkdir -p "$out"
start=$SECONDS
if [[ $what == checks || $what == all ]]; then
  timeout 150 python3 -m pytest -q -p no:cacheprovider plugins/quantization/fp8/tests > "$out/fp8_pytest.log" 2>&1
  echo "fp8 plugin tests on CUDA: exit $? ($(tail -n 1 "$out/fp8_pytest.log"))"
  timeout "${FP8_CHECK_TIMEOUT:-420}" python3 tools/device_fp8_check.py all --out "$out/fp8_check.json" > "$out/fp8_check.log" 2>&1
  echo "fp8 check passed: $(python3 -c "import json;print(json.load(open('$out/fp8_check.json'))['passed'])" 2>/dev/null || echo "no report (see fp8_check.log)")"
  grep -E "Error|error" "$out/fp8_check.log" | head -5
fi
if [[ $what == bench || $what == all ]]; then
  python3 -m minisgl_core bench make-model --shape llama-3.1-8b --out /tmp/m/llama-3.1-8b --device cuda > /dev/null
  bench() { timeout "${BENCH_TIMEOUT:-200}" python3 -m minisgl_core bench offline --model /tmp/m/llama-3.1-8b \
              --attn auto --decode-latency --output "$out/fp8_bench.jsonl" "$@" 2>>"$out/fp8_bench.log" | tail -n 1; }
  bench --label llama-3.1-8b-bf16
  bench --label llama-3.1-8b-fp8 --quantization fp8
  # fa3 has no fp8 KV path here: fi for both phases
  bench --label llama-3.1-8b-fp8-kvfp8 --quantization fp8 --kv-cache-dtype fp8_e4m3 --attn fi
  grep -E "Error|Traceback" "$out/fp8_bench.log" | head -5
fi
if [[ $what == gemv ]]; then
  # (the model made on the CPU: the sweep's timings have the GPU to themselves)
  python3 -m minisgl_core bench make-model --shape llama-3.1-8b --out /tmp/m/llama-3.1-8b --device cpu > /dev/null &
  timeout 240 python3 tools/device_gemv_sweep.py ${SWEEP_ARGS:-} --out "$out/gemv-sweep.json" > "$out/gemv-sweep.log" 2>&1
  echo "sweep exit $? ($((SECONDS - start)) s)"; grep -E "^(compiled|qkv|o |gate_up|down|per layer)" "$out/gemv-sweep.log" | cut -c1-260
  # pick_config's launch with the row rounded in arithmetic (hw_round off), as a report fp8_tuned_run reads
  python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))
rows = [{"n": l["n"], "k": l["k"], "best": [{"config": {**l["picked"]["config"], "hw_round": False}}]} for l in r["layers"]]
json.dump({"layers": rows}, open(sys.argv[2], "w"))' "$out/gemv-sweep.json" "$out/arith.json"
  wait
  echo "model made ($((SECONDS - start)) s)"
  args=(bench offline --model /tmp/m/llama-3.1-8b --attn "${ATTN:-fi,triton}" --num-requests 4 --cuda-graph-max-bs 4
        --piecewise-cuda-graph-max-tokens 0 --decode-latency --quantization fp8 --output "$out/fp8_gemv_bench.jsonl")
  line() { tail -n 1 | python3 -c 'import json, sys; d = json.loads(sys.stdin.read())
print(d["label"], d["output_tok_per_s"], "tok/s; batch-1", d.get("decode", {}).get("ms_per_token"), "ms/token")'; }
  for round in $(seq "${ROUNDS:-2}"); do  # (the first run JIT-compiles the attention kernels)
    timeout $((round == 1 ? 250 : 150)) python3 -m minisgl_core "${args[@]}" --label "fp8 pick_config round $round" 2>>"$out/fp8_gemv_bench.log" | line
    timeout 150 python3 tools/fp8_tuned_run.py "$out/arith.json" "${args[@]}" --label "fp8 pick_config arithmetic rounding round $round" 2>>"$out/fp8_gemv_bench.log" | line
    timeout 150 python3 tools/fp8_tuned_run.py "$out/gemv-sweep.json" "${args[@]}" --label "fp8 swept round $round" 2>>"$out/fp8_gemv_bench.log" | line
  done
  grep -E "Error|Traceback|configurations" "$out/fp8_gemv_bench.log" | head -5
fi
if [[ $what == head ]]; then
  python3 -m minisgl_core bench make-model --shape llama-3.1-8b --out /tmp/m/llama-3.1-8b --device cuda > /dev/null &
  timeout 150 python3 -m pytest -q -p no:cacheprovider plugins/quantization/fp8/tests -k "Cuda or gemv" > "$out/fp8_head_pytest.log" 2>&1
  echo "fp8 plugin tests on CUDA: exit $? ($(tail -n 1 "$out/fp8_head_pytest.log")) ($((SECONDS - start)) s)"
  wait
  args=(bench offline --model /tmp/m/llama-3.1-8b --attn fi,triton --num-requests 4 --cuda-graph-max-bs 4
        --piecewise-cuda-graph-max-tokens 0 --decode-latency)
  line() { tail -n 1 | python3 -c 'import json, sys; d = json.loads(sys.stdin.read())
print(d["label"], "init", d["init_seconds"], "s;", d["output_tok_per_s"], "tok/s; batch-1", d.get("decode", {}).get("ms_per_token"), "ms/token")'; }
  timeout 200 python3 -m minisgl_core "${args[@]}" --quantization fp8 --label "warm-up (discarded)" 2>>"$out/fp8_head.log" | line
  for round in $(seq "${ROUNDS:-2}"); do
    for q in fp8 fp8-head; do
      timeout 150 python3 -m minisgl_core "${args[@]}" --quantization $q --label "b1 $q (round $round)" \
        --output "$out/fp8_head_b1.jsonl" 2>>"$out/fp8_head.log" | line
    done
  done
  for q in fp8-head fp8; do
    timeout 150 python3 -m minisgl_core bench offline --model /tmp/m/llama-3.1-8b --attn auto --quantization $q \
      --label "offline $q" --output "$out/fp8_head_offline.jsonl" 2>>"$out/fp8_head.log" | line
  done
  grep -E "Error|Traceback" "$out/fp8_head.log" | head -5
fi
if [[ $what == pdlhead ]]; then
  python3 -m minisgl_core bench make-model --shape llama-3.1-8b --out /tmp/m/llama-3.1-8b --device cuda > /dev/null
  echo "model made ($((SECONDS - start)) s)"
  args=(bench offline --model /tmp/m/llama-3.1-8b --attn fi,triton --num-requests 4 --cuda-graph-max-bs 4
        --piecewise-cuda-graph-max-tokens 0 --decode-latency --quantization fp8-head)
  line() { tail -n 1 | python3 -c 'import json, sys; d = json.loads(sys.stdin.read())
print(d["label"], "init", d["init_seconds"], "s;", d["output_tok_per_s"], "tok/s; batch-1", d.get("decode", {}).get("ms_per_token"), "ms/token")'; }
  timeout 200 python3 -m minisgl_core "${args[@]}" --label "warm-up (discarded)" 2>>"$out/fp8_pdl.log" | line
  for round in $(seq "${ROUNDS:-2}"); do
    for pdl in 0 1; do
      MINISGL_PDL=$pdl timeout 150 python3 -m minisgl_core "${args[@]}" --label "b1 fp8-head MINISGL_PDL=$pdl (round $round)" \
        --output "$out/fp8_pdl_b1.jsonl" 2>>"$out/fp8_pdl.log" | line
    done
  done
  grep -E "Error|Traceback" "$out/fp8_pdl.log" | head -5
fi
echo "device_fp8.sh: $((SECONDS - start)) s"
