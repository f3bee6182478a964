"""Side-by-side table of tools/peer_compare.sh's results: every run of ours and of the peer.

    python3 tools/peer_table.py peer-compare.jsonl

Lines without an "engine" key are `minisgl bench offline` results; "engine": "mini-sglang" ones
come from shared/peer/bench_peer.py. Runs keep their order, so the first of each is the
fresh-process figure; ratios are ours over the peer's default (first runs, best runs).
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict


def config_of(run: dict) -> tuple[str, str, str]:
    """(shape, engine, configuration) of one result line."""
    if run.get("engine") == "mini-sglang":
        shape = os.path.basename(run.get("model", "?").rstrip("/"))
        return shape, "mini-sglang", f"{run.get('attn', '?')} page {run.get('page_size', '?')}"
    shape = os.path.basename(str(run.get("shape", "?")).rstrip("/"))
    words = run.get("label", "").split()[2:]  # "<shape> r<n> [variant words]"
    variant = " ".join(words) or "default"
    return shape, "minisgl", f"{run.get('attn', '?')} page {run.get('page_size', '?')} {variant}"


def main(path: str) -> int:
    runs: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    machine: dict[str, str] = {}
    with open(path) as f:
        for line in f:
            if line.strip().startswith("{"):
                run = json.loads(line)
                if "output_tok_per_s" not in run:
                    print(f"failed run: {line.strip()[:300]}", file=sys.stderr)
                    continue
                key = config_of(run)
                runs[key].append(run)
                machine.setdefault(key[0], str(run.get("hardware", "?")))
    print(
        "| shape | engine | configuration | output tok/s, runs in order | start-up s | first / best vs peer |"
    )
    print("|---|---|---|---|---|---|")
    for shape in dict.fromkeys(k[0] for k in runs):
        peer = next((v for k, v in runs.items() if k[0] == shape and k[1] == "mini-sglang"), [])
        for (s, engine, config), results in runs.items():
            if s != shape:
                continue
            figures = [r["output_tok_per_s"] for r in results]
            startup = [r.get("init_seconds") for r in results if r.get("init_seconds") is not None]
            ratio = ""
            if peer and engine == "minisgl":
                peer_figures = [r["output_tok_per_s"] for r in peer]
                ratio = f"{figures[0] / peer_figures[0]:.3f} / {max(figures) / max(peer_figures):.3f}"
            print(f"| {shape} | {engine} | {config} | {' · '.join(f'{x:,.0f}' for x in figures)} | "
                  f"{' · '.join(f'{x:.0f}' for x in startup)} | {ratio} |")  # fmt: skip
    for shape, hw in machine.items():
        print(f"\n{shape}: {hw}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
