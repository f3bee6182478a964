#!/usr/bin/env bash
# One call on the 2-GPU machine (`nvidia-h200-x2`, .whl carried): tensor parallelism's all-reduce.
#   source .whl/prelude.sh && bash tools/device_tp.sh [check|repeat|pages|pairs]
# The symmetric-memory all-reduce against NCCL (bitwise, eager and in CUDA graphs; latency), then
# Llama-3.1-8B offline at TP=1, TP=2 (symmetric memory for decode-sized sums) and TP=2 with
# MINISGL_SYMM_MEM=0 (NCCL only). "repeat": no check; TP=2 symm, TP=2 NCCL, TP=1, TP=2 symm,
# TP=2 NCCL, alternating. "pages": a discarded Qwen3-0.6B TP=2 run (JIT, both GPUs), then TP=1 and
# TP=2 at page size 1 and at page size 16, each with a step trace ($OUT/steps-tp{1,2}-p{1,16}.jsonl,
# summarised by tools/step_trace.py into the output).
# "pairs": the check, then TP=2, TP=1, TP=2, TP=1 (defaults).
# "ab": the check, then TP=2, TP=2 without the wide all-reduce and the vocabulary-parallel sampler
# (as before them), TP=1, TP=2 without each one alone, TP=2 again.
# "norm": the two-GPU engine tests (tests/test_tensor_parallel.py -k cuda: the fused all-reduce +
# norm bitwise against the unfused path, piecewise prefill graphs under TP), the check, then TP=2,
# TP=2 with MINISGL_SYMM_MEM_NORM=0 (the sum, then the norm), TP=2, TP=1 (as long as the call lasts);
# "norm2": the same tests and check, then TP=2, TP=1, TP=2. "quick": the tests, TP=2, TP=1.
# "prof": the tests, the check, a TP=2 profile (tools/device_tp_profile.py, windows 100 450 850:
# $OUT/profile-tp2.{json,txt}), then TP=2, TP=1.
# "pdl": the two-GPU engine tests with MINISGL_PDL=1 (programmatic dependent launch), then TP=2 and
# TP=1 with MINISGL_PDL=0 and =1 alternating.
# "barrier": the check (no tests), then TP=2, TP=2 with MINISGL_SYMM_MEM_NORM_BARRIER=0 (the fused
# kernel behind PyTorch's barrier kernel), TP=1, TP=2, TP=2 with it =0.
# "profile": tools/device_tp_profile.py at TP=2, then TP=1 (windows 100 450 850; $OUT/profile-tp{2,1}.{json,txt}).
# "auto": no tests, no check; TP=2, TP=1, TP=2 with MINISGL_PDL=1, TP=2 (for ATTN=auto, the default's
# FA3 prefill + Triton decode: the first TP=2 run pays the FA3 JIT in its start-up).
# "ratio": no tests, no check; TP=2, TP=1, TP=2 (each run stops at LIMIT; the first TP=2 pays the
# start-up JIT on a fresh machine).
# ATTN (default fi, as every run above measured) picks the attention backends of every run; LIMIT
# (default 200) the seconds each run may take.
# Results: $OUT/allreduce.json, $OUT/bench.jsonl, $OUT/logs.tgz.
set -uo pipefail
what=${1:-check}
out=${OUT:-/tmp/out}; logs=/tmp/logs; mkdir -p "$out" $logs
m=/tmp/m
attn=${ATTN:-fi}
python3 -m minisgl_core bench make-model --shape llama-3.1-8b --out $m/llama-3.1-8b --device cuda >/dev/null &
if [[ $what == pages ]]; then
  python3 -m minisgl_core bench make-model --shape qwen3-0.6b --out $m/qwen3-0.6b --device cuda >/dev/null
  timeout 200 python3 -m minisgl_core bench offline --model $m/qwen3-0.6b --attn fi --tp 2 --label "warm-up (discarded)" \
    2>$logs/warm-up.log | tail -n 1 | cut -c1-200
fi
if [[ $what == pdl ]]; then
  MINISGL_PDL=1 timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_tensor_parallel.py -k cuda > "$out/pytest-tp.log" 2>&1
  tail -n 3 "$out/pytest-tp.log"
fi
if [[ $what == norm || $what == norm2 || $what == quick || $what == prof ]]; then
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_tensor_parallel.py -k cuda > "$out/pytest-tp.log" 2>&1
  tail -n 3 "$out/pytest-tp.log"
fi
if [[ $what == check || $what == pairs || $what == ab || $what == norm || $what == norm2 || $what == prof || $what == barrier ]]; then
  timeout 240 python3 tools/device_allreduce_check.py --json "$out/allreduce.json" > $logs/allreduce.log 2>&1
  echo "all-reduce check exit $?"; grep -A12 graph_us_per_all_reduce $logs/allreduce.log | head -14
  grep -A27 graph_us_per_sum_add_norm $logs/allreduce.log | tr -d ' \n'; echo
  grep -m3 -i "error\|fail\|warn" $logs/allreduce.log
fi
wait
bench() { timeout ${LIMIT:-200} python3 -m minisgl_core bench offline --model $m/llama-3.1-8b --attn "$attn" --output "$out/bench.jsonl" "$@" | tail -n 1 \
  | python3 -c 'import json, sys; d = json.loads(sys.stdin.read()); print(d["label"], d.get("attn", ""), d["output_tok_per_s"], d["seconds"], d.get("init_seconds", ""), d.get("page_size", ""), d.get("decode", ""))'; }
tp1() { CUDA_VISIBLE_DEVICES=0 bench --label llama-3.1-8b-tp1 "$@" 2>>$logs/tp1.log; }
tp2() { bench --tp 2 --label "llama-3.1-8b-tp2 symm-mem" 2>>$logs/tp2.log; }
tp2_before() { MINISGL_SYMM_MEM_WIDE=0 MINISGL_VOCAB_PARALLEL_SAMPLING=0 bench --tp 2 \
  --label "llama-3.1-8b-tp2 one-shot only, gathered logits (MINISGL_SYMM_MEM_WIDE=0 MINISGL_VOCAB_PARALLEL_SAMPLING=0)" 2>>$logs/tp2.log; }
tp2_without() { ( export "$1=0"; bench --tp 2 --label "llama-3.1-8b-tp2 $1=0" 2>>$logs/tp2.log ); }
tp2_nccl() { MINISGL_SYMM_MEM=0 bench --tp 2 --label "llama-3.1-8b-tp2 nccl (MINISGL_SYMM_MEM=0)" 2>>$logs/tp2-nccl.log; }
traced() {  # TP PAGE: one run with its step trace
  local f="$out/steps-tp$1-p$2.jsonl"
  if [[ $1 == 1 ]]; then
    MINISGL_STEP_TRACE=$f CUDA_VISIBLE_DEVICES=0 bench --page-size "$2" --label "llama-3.1-8b-tp1 page $2" 2>>$logs/tp1.log
  else
    MINISGL_STEP_TRACE=$f bench --tp 2 --page-size "$2" --label "llama-3.1-8b-tp2 page $2" 2>>$logs/tp2.log
  fi
  python3 tools/step_trace.py "$f" --bucket 100 2>&1 | head -n 12
}
if [[ $what == check ]]; then
  tp1; tp2; tp2_nccl
elif [[ $what == pairs ]]; then
  tp2; tp1 --decode-latency; tp2; tp1 --decode-latency
elif [[ $what == ab ]]; then
  tp2; tp2_before; tp1; tp2_without MINISGL_SYMM_MEM_WIDE; tp2_without MINISGL_VOCAB_PARALLEL_SAMPLING; tp2
elif [[ $what == norm ]]; then
  tp2; tp2_without MINISGL_SYMM_MEM_NORM; tp2; tp1
elif [[ $what == norm2 ]]; then
  tp2; tp1; tp2
elif [[ $what == ratio ]]; then
  tp2; tp1; tp2
elif [[ $what == quick ]]; then
  tp2; tp1
elif [[ $what == pdl ]]; then
  tp2_pdl() { ( export MINISGL_PDL=$1; bench --tp 2 --label "llama-3.1-8b-tp2 MINISGL_PDL=$1" 2>>$logs/tp2.log ); }
  tp1_pdl() { ( export MINISGL_PDL=$1; tp1 --label "llama-3.1-8b-tp1 MINISGL_PDL=$1" ); }
  tp2_pdl 0; tp2_pdl 1; tp1_pdl 0; tp1_pdl 1; tp2_pdl 0; tp2_pdl 1
elif [[ $what == profile ]]; then
  for tp in 2 1; do  # (the first pays FlashInfer's FA3 JIT on a fresh machine; TP=1 gets what is left of 560 s)
    limit=$((tp == 2 ? 380 : 560 - SECONDS)); ((limit > 60)) || break
    timeout $limit python3 tools/device_tp_profile.py $m/llama-3.1-8b --attn "$attn" --tp $tp --windows 100 450 850 \
      --json "$out/profile-tp$tp.json" > "$out/profile-tp$tp.txt" 2>>$logs/profile.log
    echo "profile TP=$tp exit $?"; grep -v '^ ' "$out/profile-tp$tp.txt" | cut -c1-400
  done
elif [[ $what == auto ]]; then
  tp2; tp1; ( export MINISGL_PDL=1; bench --tp 2 --label "llama-3.1-8b-tp2 MINISGL_PDL=1" 2>>$logs/tp2.log ); tp2
elif [[ $what == barrier ]]; then
  tp2; tp2_without MINISGL_SYMM_MEM_NORM_BARRIER; tp1; tp2; tp2_without MINISGL_SYMM_MEM_NORM_BARRIER
elif [[ $what == prof ]]; then
  timeout 200 python3 tools/device_tp_profile.py $m/llama-3.1-8b --attn "$attn" --tp 2 --windows 100 450 850 \
    --json "$out/profile-tp2.json" > "$out/profile-tp2.txt" 2>>$logs/profile.log
  echo "profile exit $?"; grep '^{' "$out/profile-tp2.txt" | cut -c1-400
  tp2; tp1
elif [[ $what == pages ]]; then
  traced 1 1; traced 2 1; traced 1 16; traced 2 16
else
  tp2; tp2_nccl; tp1; tp2; tp2_nccl
fi
grep -m5 "Traceback" $logs/*.log
tar -czf "$out/logs.tgz" -C /tmp logs
