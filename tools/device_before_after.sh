#!/usr/bin/env bash
# An earlier commit against this tree on the GPU, in one call (issue 17 asks that the architecture
# work costs no speed): the standard offline workload with batch-1 decode latency, the two trees
# alternating, each run a fresh process, every run reported. BEFORE is a plain tree of the earlier
# commit (`git archive COMMIT | tar -x -C .dev/before`, carried); each run first reinstalls that
# tree's packages, core and plugins, editable and without an index, having removed every minisgl
# distribution (the two trees ship different plugin sets). Models are made once in /tmp/m.
#
#   source .whl/prelude.sh && BEFORE=.dev/before bash tools/device_before_after.sh [SHAPE ...]
#
# Environment: ROUNDS (default 1), ATTN (default fi), OUT (default /tmp/out), TREES (default
# "before after"; "before" alone when this tree's runs come from tools/peer_compare.sh in the same call),
# MODES (default "free"; "free constrained" adds runs with every request under the builtin JSON
# schema, `--grammar-schema builtin`), LATENCY (default 1; 0 leaves out the batch-1 decode), EXTRA
# (more `bench offline` flags for every run, e.g. "--quantization fp8"). Output:
# $OUT/before-after.jsonl (one `bench offline` result per run) and a table on stdout.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
out=${OUT:-/tmp/out}
mkdir -p "$out" /tmp/m
before=$(cd "${BEFORE:?set BEFORE to the earlier tree}" && pwd)
shapes=("$@")
[ ${#shapes[@]} -gt 0 ] || shapes=(qwen3-0.6b llama-3.1-8b)
results="$out/before-after.jsonl"
say() { echo "[before_after $(date -u +%H:%M:%S)] $*"; }

source "$here/_use_tree.sh"

for shape in "${shapes[@]}"; do
  [ -f "/tmp/m/$shape/config.json" ] || python3 -m minisgl_core bench make-model --shape "$shape" \
    --out "/tmp/m/$shape" --device cuda >>"$out/make-model.log" 2>&1 || { say "make-model $shape failed"; exit 1; }
done
for shape in "${shapes[@]}"; do
  for round in $(seq "${ROUNDS:-1}"); do
    for which in ${TREES:-before after}; do
      tree=$root; [ "$which" = before ] && tree=$before
      use_tree "$tree" || { say "install of $which failed"; exit 1; }
      for mode in ${MODES:-free}; do
        read -r -a extra <<< "${EXTRA:-}"
        [ "${LATENCY:-1}" = 1 ] && extra+=(--decode-latency)
        [ "$mode" = constrained ] && extra+=(--grammar-schema builtin)
        say "$which $mode $shape r$round"
        (cd /tmp && timeout 300 python3 -m minisgl_core bench offline --model "/tmp/m/$shape" --attn "${ATTN:-fi}" \
          "${extra[@]}" --label "$which $mode $shape r$round" --output "$results" 2>>"$out/before-after.log" |
          tail -n 1 | cut -c1-300)
      done
    done
  done
done
use_tree "$root"
python3 - "$results" <<'PY'
import json, sys
print("| run | output tok/s | batch-1 decode ms/token |")
print("|---|---|---|")
for line in open(sys.argv[1]):
    r = json.loads(line)
    tput = r.get("output_tok_per_s")
    b1 = (r.get("decode") or {}).get("ms_per_token")
    print(f"| {r.get('label')} | {tput} | {b1} |")
PY
