"""Where the host waits for the device inside engine steps: PyTorch's sync debug mode over the
first steps of the standard offline workload (prefill steps of 8,192 tokens, then decode), each
synchronizing call site counted per step kind with the innermost project frames. Run on the GPU
machine (see ../shared/device/README.md):

    python3 tools/device_sync_probe.py /tmp/m/qwen3-0.6b --out $OUT/sync.json [--steps 30]

A synchronizing op inside a step's launch makes overlap scheduling wait for the step before it:
the host then adds its own time to the device's instead of hiding it.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
import warnings
from collections import Counter, defaultdict

import torch


def _site() -> str:
    """The innermost frames of this project (or its plugins) on the stack, innermost first."""
    frames = [
        f for f in traceback.extract_stack() if "minisgl" in f.filename and "sync_probe" not in f.filename
    ]
    return " <- ".join(f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno} {f.name}" for f in reversed(frames[-4:]))


def main() -> None:
    from minisgl_core.bench.workloads import standard_offline
    from minisgl_core.llm import LLM
    from minisgl_core.sampling import SamplingParams

    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--attn", default="fi")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    llm = LLM(args.model, attn=args.attn)
    engine = llm.engine
    llm.generate([[1, 2, 3, 4]] * 4, SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)
    vocab = engine.runner.vocab_size
    for i, r in enumerate(standard_offline(256, seed=0)):
        engine.add_request(
            10_000 + i,
            [t % vocab for t in r.prompt_ids],
            SamplingParams(temperature=0.6, max_tokens=r.max_tokens, ignore_eos=True),
        )
    sites: dict[str, Counter] = defaultdict(Counter)
    steps: list[dict] = []
    current = ["?"]

    def record(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001
        if "synchroniz" in str(message):
            sites[current[0]][f"{str(message)[:60]} @ {_site()}"] += 1

    warnings.showwarning = record
    warnings.simplefilter("always")
    torch.cuda.synchronize()
    for _ in range(args.steps):
        if not engine.has_work:
            break
        torch.cuda.set_sync_debug_mode("warn")
        start = time.perf_counter()
        current[0] = "step"
        engine.step()
        torch.cuda.set_sync_debug_mode("default")
        launched = engine.launched_last
        kind = "none" if launched is None else launched.kind
        steps.append({"kind": kind, "ms": round((time.perf_counter() - start) * 1e3, 2)})
        if "step" in sites:
            sites[kind].update(sites.pop("step"))
    report = {
        "steps": steps,
        "sync_sites": {kind: dict(counter.most_common(20)) for kind, counter in sites.items()},
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report["sync_sites"], indent=1)[:6000])
    print(steps[:24])
    llm.close()


if __name__ == "__main__":
    main()
