#!/usr/bin/env bash
# One call on one GPU (.whl carried): constrained vs free offline throughput with interpreter or
# engine settings A/B'd in the same call (issue 18). Qwen3-0.6B shape, the standard offline
# workload, `bench offline --attn fi`, each run a fresh process with its step trace; a discarded
# constrained run first (FlashInfer JIT, compile caches). Runs, in order, from RUNS: lines of
# "LABEL|ENV=VALUE ...|EXTRA FLAGS" (flags with "C" as the first word run constrained, the rest free).
#   source .whl/prelude.sh && RUNS="$(cat runs.txt)" bash tools/device_grammar_ab.sh
# Results: $OUT/ab.jsonl (one line per run), steps-N.txt and steps-N.jsonl.gz (step traces), $OUT/ab-table.md.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
m=/tmp/m; shape=qwen3-0.6b
python3 -m minisgl_core bench make-model --shape "$shape" --out "$m/$shape" --device cuda >/dev/null
if [[ ${WARM_UP:-1} == 1 ]]; then  # WARM_UP=0: the first run's start-up JITs instead (not its throughput)
  timeout 150 python3 -m minisgl_core bench offline --model "$m/$shape" --attn fi --label warm-up \
    --grammar-schema builtin 2>"$out/ab.log" | tail -n 1 | cut -c1-120
fi
n=0
while IFS='|' read -r label envs flags; do
  [[ -z $label ]] && continue
  n=$((n + 1))
  read -r -a fl <<< "$flags"
  if [[ ${fl[0]:-} == C ]]; then fl=(--grammar-schema builtin "${fl[@]:1}"); fi
  # shellcheck disable=SC2086
  env $envs timeout 150 python3 -m minisgl_core bench offline --model "$m/$shape" --attn fi --label "$label" \
    --step-trace "/tmp/steps-$n.jsonl" --output "$out/ab.jsonl" "${fl[@]}" 2>>"$out/ab.log" | tail -n 1 \
    | python3 -c 'import json, sys; d = json.loads(sys.stdin.read()); print(d["label"], d["output_tok_per_s"])'
  python3 tools/step_trace.py "/tmp/steps-$n.jsonl" > "$out/steps-$n.txt" 2>&1 && gzip -c "/tmp/steps-$n.jsonl" > "$out/steps-$n.jsonl.gz"
done <<< "$RUNS"
python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = [json.loads(l) for l in (out / "ab.jsonl").read_text().splitlines() if l.strip()]
free = max((r["output_tok_per_s"] for r in rows if "grammar_backend" not in r), default=None)
lines = ["| run | output tok/s | / best free |", "|---|---:|---:|"]
for r in rows:
    ratio = f"{r['output_tok_per_s'] / free:.3f}" if free else ""
    lines.append(f"| {r['label']} | {r['output_tok_per_s']:,} | {ratio} |")
(out / "ab-table.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
