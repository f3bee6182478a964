#!/usr/bin/env bash
# One call on one H200 (.whl carried): the Triton decode backend's cascade path and exact P·V.
#   source .whl/prelude.sh && bash tools/device_triton_cascade.sh [suite] [micro] [shared] [e2e] [offline]
# suite:   the plugin's tests natively (conformance suite incl. cascade and its CUDA graphs)
# micro:   tools/device_triton_decode.py (one layer, graph replay; exact P·V on and off)
# shared:  the shared-prefix workload in the engine (tools/device_profile.py steps), Qwen3-0.6B,
#          256 running: --attn fi (FlashInfer cascade), fi,triton (Triton cascade), fi,triton
#          --disable-cascade (SHARED_VARIANTS="fi;fi,triton": others, ';'-separated)
# e2e:     tools/device_e2e.py on torch_bf16, fi, fi_triton, fi_triton_no_graph, fi_triton_exact_pv, fa3_triton
# offline: the standard offline workload, --attn fi then fi,triton, after a discarded warm-up
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
m=/tmp/m
stages=${*:-suite micro shared}
has() { [[ " $stages " == *" $1 "* ]]; }
if has suite; then
  timeout 240 python3 -m pytest -q -p no:cacheprovider plugins/attention/triton/tests 2>&1 | tail -n 5 | tee "$out/suite.txt"
fi
if has micro; then
  timeout 200 python3 tools/device_triton_decode.py --json "$out/micro.json" 2>&1 | tail -n 20
fi
if has shared || has offline; then
  python3 -m minisgl_core bench make-model --shape qwen3-0.6b --out $m/qwen3-0.6b --device cuda >/dev/null
fi
if has shared; then
  IFS=';' read -ra variants <<< "${SHARED_VARIANTS:-fi;fi,triton;fi,triton --disable-cascade}"
  for variant in "${variants[@]}"; do
    label=${variant// /_}; label=${label//,/-}; label=${label//--/}  # $OUT returns plain names only (no "," or "+")
    # shellcheck disable=SC2086  # the variant's words are separate flags
    timeout 200 python3 tools/device_profile.py steps $m/qwen3-0.6b --workload shared-prefix --max-running 256 \
      --attn $variant --json "$out/shared-$label.json" > "$out/shared-$label.txt" 2>&1
    python3 - "$out/shared-$label.json" "$variant" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(sys.argv[2], {k: s[k] for k in ("total_s", "output_tok_per_s", "cascade_steps", "groups_per_cascade_step")},
      {k: v["ms_per_step"] for k, v in s["buckets"].items()}, s.get("window", {}).get("device_busy_ms"))
PY
  done
fi
if has e2e; then
  timeout 400 python3 tools/device_e2e.py --out "$out/e2e.json" --configs torch_bf16,fi,fi_triton,fi_triton_no_graph,fi_triton_exact_pv,fa3_triton \
    > "$out/e2e.txt" 2>&1
  python3 - "$out/e2e.json" <<'PY' || tail -n 30 "$out/e2e.txt"
import json, sys
r = json.load(open(sys.argv[1]))
print("e2e passed:", r["passed"])
for arch, model in r["models"].items():
    for name, c in model["configs"].items():
        print(arch, name, {k: c.get(k) for k in ("ok", "token_gap_max", "token_gap_p99", "tokens_off_best",
              "first_logprob_max_diff", "first_token_ok", "error")})
    print(arch, {k: v for k, v in model.items() if k != "configs"})
PY
fi
if has offline; then
  timeout 150 python3 -m minisgl_core bench offline --model $m/qwen3-0.6b --attn fi --label "warm-up (discarded)" \
    2>/dev/null | tail -n 1 | cut -c1-300
  for attn in fi fi,triton; do
    timeout 150 python3 -m minisgl_core bench offline --model $m/qwen3-0.6b --attn $attn --label "qwen3-0.6b --attn $attn" \
      --output "$out/offline.jsonl" 2>>"$out/offline.log" | tail -n 1 | cut -c1-400
  done
fi
