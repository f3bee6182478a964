"""The standard offline workload in one process, FlashInfer decode against the Triton decode with
P·V float32-accurate (``exact_pv``, two products) and with P rounded once (issue 19).

    python3 tools/device_triton_pv.py MODEL_DIR [--rounds 2] [--json OUT.json]

Each variant builds its own engine (``--attn fi`` / ``fi,triton``) per round and runs the
workload once in it; variants take turns within a round, so the machine's drift falls on all of
them. (Until 3e1de2b the first round ran the workload twice in one engine: its measured run found
every prompt in the radix cache.)"""

from __future__ import annotations

import argparse
import json

from minisgl_core.bench.offline import run_offline
from minisgl_core.bench.workloads import standard_offline
from minisgl_core.llm import LLM

VARIANTS = {
    "fi": ("fi", None),
    "fi,triton exact_pv": ("fi,triton", True),
    "fi,triton rounded_pv": ("fi,triton", False),
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json")
    args = p.parse_args()
    from minisgl_plugin_triton.backend import TritonDecodeBackend

    requests = standard_offline(256, seed=0)
    rows = []
    for round_ in range(args.rounds):
        for name, (attn, exact) in VARIANTS.items():
            if exact is not None:
                TritonDecodeBackend.exact_pv = exact
            llm = LLM(args.model, attn=attn)
            result = {"variant": name, "round": round_ + 1, **run_offline(llm, requests)}
            llm.close()
            rows.append(result)
            print(json.dumps(result), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
