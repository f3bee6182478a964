"""The torch backend's CPU decode attention one KV head at a time against all heads in one
product (``TorchAttentionBackend._decode``, switched by its module's ``_HEAD_BY_HEAD_ELEMENTS``),
and the default model's decode step end to end. Run the engine mode with an earlier tree first on
``PYTHONPATH`` (its torch plugin too) for that tree's figure.

    python tools/cpu_decode_attention.py --kernel                   # ms a layer, both ways
    python tools/cpu_decode_attention.py --engine 32,400 [--engine 16,100 ...]   # ms a decode step
"""

from __future__ import annotations

import argparse
import time
import types

#: (sequences, keys, KV heads, query heads a KV head, head dim): SmolLM2-135M's heads at a few
#: batches and lengths, and Qwen3-0.6B's
KERNEL_CASES = [
    (1, 300, 3, 3, 64),
    (8, 87, 3, 3, 64),
    (16, 87, 3, 3, 64),
    (64, 200, 3, 3, 64),
    (4, 600, 3, 3, 64),
    (32, 600, 8, 2, 128),
]


def kernel(reps: int) -> None:
    import torch
    from minisgl_plugin_torch import backend

    gen = torch.Generator().manual_seed(0)
    fake = types.SimpleNamespace(config=types.SimpleNamespace(scale=0.125))
    for bs, n, kv, group, dim in KERNEL_CASES:
        pool_k, pool_v = (
            torch.randn(20000, kv, dim, generator=gen),
            torch.randn(20000, kv, dim, generator=gen),
        )
        slots = torch.randint(0, 20000, (bs, n), generator=gen)
        keys = backend._gather_rows(pool_k[:, None], slots)
        values = backend._gather_rows(pool_v[:, None], slots)
        q = torch.randn(bs, kv * group, dim, generator=gen)
        mask = torch.rand(bs, 1, 1, n, generator=gen) > 0.1
        line, outs = [], {}
        for name, threshold in (("all heads", 1 << 62), ("head by head", 0)):
            backend._HEAD_BY_HEAD_ELEMENTS = threshold
            for _ in range(3):
                outs[name] = backend.TorchAttentionBackend._decode(fake, q, keys, values, mask)
            times = []
            for _ in range(reps):
                started = time.perf_counter()
                backend.TorchAttentionBackend._decode(fake, q, keys, values, mask)
                times.append(time.perf_counter() - started)
            line.append(f"{name} {sorted(times)[reps // 2] * 1e3:.3f} ms")
        diff = (outs["all heads"] - outs["head by head"]).abs().max().item()
        print(
            f"{bs} x {n} keys, {kv} KV heads x {group}, dim {dim}: "
            + ", ".join(line)
            + f" (max diff {diff:.1e})"
        )


def engine(batch: int, prompt_tokens: int) -> None:
    from minisgl_core import LLM
    from minisgl_core.sampling import SamplingParams

    with LLM(attn="torch") as llm:
        prompts = [[1 + (i * 7 + j * 13) % 4000 for j in range(prompt_tokens)] for i in range(batch)]

        def generate(tokens: int) -> float:
            params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
            started = time.perf_counter()
            llm.generate(prompts, params, use_tqdm=False)
            return time.perf_counter() - started

        generate(4)  # the prompts into the prefix cache: the runs below prefill nothing new
        steps = [(generate(40) - generate(8)) / 32 * 1e3 for _ in range(3)]
        print(
            f"batch {batch}, {prompt_tokens}-token prompts: decode ms a step "
            + " ".join(f"{s:.1f}" for s in steps)
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kernel", action="store_true", help="time _decode alone, both ways")
    p.add_argument("--reps", type=int, default=21)
    p.add_argument("--engine", action="append", default=[], metavar="BATCH,PROMPT_TOKENS")
    args = p.parse_args()
    if args.kernel:
        kernel(args.reps)
    for spec in args.engine:
        batch, prompt_tokens = (int(x) for x in spec.split(","))
        engine(batch, prompt_tokens)


if __name__ == "__main__":
    main()
