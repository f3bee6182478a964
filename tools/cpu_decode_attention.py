"""The torch backend's CPU decode attention one KV head at a time against all heads in one
product (``TorchAttentionBackend._decode``, switched by its module's ``_HEAD_BY_HEAD_ELEMENTS``),
a cascade step's ``_attend`` (own suffixes, a shared prefix) against an earlier tree's (``DIR``:
a ``git archive`` of it), and the default model's decode step end to end. Run the engine mode with an earlier tree first on
``PYTHONPATH`` (its torch plugin too) for that tree's figure.

    python tools/cpu_decode_attention.py --kernel                   # ms a layer, both ways
    python tools/cpu_decode_attention.py --cascade --before DIR     # _attend against DIR's
    python tools/cpu_decode_attention.py --engine 32,400 [--engine 16,100 ...]   # ms a decode step
"""

from __future__ import annotations

import argparse
import functools
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


def _timed(call, reps: int):
    """``call()``'s result (after three warm-up calls) and its median time over ``reps`` calls, ms."""
    for _ in range(3):
        out = call()
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return out, sorted(times)[reps // 2] * 1e3


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
            outs[name], ms = _timed(
                functools.partial(backend.TorchAttentionBackend._decode, fake, q, keys, values, mask), reps
            )
            line.append(f"{name} {ms:.3f} ms")
        diff = (outs["all heads"] - outs["head by head"]).abs().max().item()
        print(
            f"{bs} x {n} keys, {kv} KV heads x {group}, dim {dim}: "
            + ", ".join(line)
            + f" (max diff {diff:.1e})"
        )


#: (what, sequences, query heads, KV heads, queries a sequence, keys, masked): a cascade decode
#: step's two calls of ``_attend``, at SmolLM2-135M's heads and Qwen3-0.6B's
CASCADE_CASES = [
    ("own suffixes", 32, 9, 3, 1, 60, True),
    ("own suffixes", 64, 9, 3, 1, 200, True),
    ("a prefix shared by 16", 1, 9, 3, 16, 1000, False),
    ("a prefix shared by 8 (Qwen3-0.6B heads)", 1, 16, 8, 8, 2000, False),
]


def cascade(before: str, reps: int) -> None:
    import importlib.util
    import pathlib

    import torch
    from minisgl_plugin_torch import backend

    path = pathlib.Path(before) / "plugins/attention/torch/minisgl_plugin_torch/backend.py"
    spec = importlib.util.spec_from_file_location("before_backend", path)
    assert spec is not None and spec.loader is not None
    earlier = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(earlier)
    gen = torch.Generator().manual_seed(0)
    fake = types.SimpleNamespace(config=types.SimpleNamespace(scale=0.125))
    for what, bs, heads, kv, t, n, masked in CASCADE_CASES:
        pool = torch.randn(50000, 1, kv, 64, generator=gen)
        slots = torch.randint(0, 50000, (bs, n), generator=gen)
        k, v = backend._gather(pool, slots), backend._gather(pool.flip(0), slots)
        q = torch.randn(t, bs, heads, 64, generator=gen).permute(1, 2, 0, 3)  # a view, as the engine's
        mask = (torch.rand(bs, 1, 1, n, generator=gen) > 0.1) if masked else None
        line, outs = [], {}
        for name, module in (("before", earlier), ("now", backend)):
            outs[name], ms = _timed(
                functools.partial(module.TorchAttentionBackend._attend, fake, q, k, v, mask), reps
            )
            line.append(f"{name} {ms:.3f} ms")
        diff = (outs["before"][0] - outs["now"][0]).abs().max().item()
        print(
            f"{what}, {bs} x {t} queries, {heads} heads / {kv} KV, {n} keys: "
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
    p.add_argument("--cascade", action="store_true", help="time _attend against --before's")
    p.add_argument("--before", default=None, help="an earlier tree (git archive) for --cascade")
    p.add_argument("--reps", type=int, default=21)
    p.add_argument("--engine", action="append", default=[], metavar="BATCH,PROMPT_TOKENS")
    args = p.parse_args()
    if args.kernel:
        kernel(args.reps)
    if args.cascade:
        if args.before is None:
            p.error("--cascade needs --before DIR (an earlier tree, e.g. git archive REV | tar -x -C DIR)")
        cascade(args.before, args.reps)
    for spec in args.engine:
        batch, prompt_tokens = (int(x) for x in spec.split(","))
        engine(batch, prompt_tokens)


if __name__ == "__main__":
    main()
