"""Offline throughput of the default model on the CPU with temperature sampling (the Gumbel-max
race, which ``minisgl bench cpu``'s greedy runs never reach), and the race alone against the former
one-level draw. Run it with an earlier tree's core first on PYTHONPATH for that tree's figure.

    python tools/cpu_sampling.py --batch 16            # LLM.generate: tok/s, best of 3 and first
    python tools/cpu_sampling.py --race --rows 1,8,16,64
"""

from __future__ import annotations

import argparse
import sys
import time


def race(rows_list: list[int], vocab: int) -> None:
    import torch

    from minisgl_core.runner import sampler

    two_level = getattr(sampler, "gumbel_max_two_level", None)
    for rows in rows_list:
        logits = torch.randn(rows, vocab) * 3
        scale, noise = torch.full((rows,), 1 / 0.7), torch.ones(rows)
        ways = {"one-level": sampler.gumbel_argmax_compiled}
        if two_level is not None:
            ways["two-level"] = two_level
        line = []
        for name, fn in ways.items():
            for _ in range(3):
                fn(logits, scale, noise)
            times = []
            for _ in range(15):
                started = time.perf_counter()
                fn(logits, scale, noise)
                times.append(time.perf_counter() - started)
            line.append(f"{name} {sorted(times)[7] * 1e3:.3f} ms")
        print(f"{rows} rows x {vocab}: " + ", ".join(line), flush=True)


def generate(batch: int, prompt_tokens: int, new_tokens: int) -> None:
    from minisgl_core import LLM
    from minisgl_core.sampling import SamplingParams

    with LLM(attn="torch") as llm:
        prompts = [[1 + (i * 7 + j) % 4000 for j in range(prompt_tokens)] for i in range(batch)]
        params = SamplingParams(temperature=0.7, max_tokens=new_tokens, ignore_eos=True)
        llm.generate(prompts[:2], SamplingParams(temperature=0.7, max_tokens=4), use_tqdm=False)
        times = []
        for _ in range(3):
            started = time.perf_counter()
            out = llm.generate(prompts, params, use_tqdm=False)
            times.append(time.perf_counter() - started)
        tokens = sum(len(o.token_ids) for o in out)
        print(
            f"batch {batch}: {tokens / min(times):.1f} tok/s best of 3, {tokens / times[0]:.1f} first",
            flush=True,
        )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--race", action="store_true", help="time the race alone instead")
    p.add_argument("--rows", default="1,8,16,64")
    p.add_argument("--vocab", type=int, default=49152)
    args = p.parse_args()
    import minisgl_core

    print("core from", minisgl_core.__file__, file=sys.stderr)
    if args.race:
        race([int(r) for r in args.rows.split(",")], args.vocab)
    else:
        generate(args.batch, args.prompt_tokens, args.new_tokens)


if __name__ == "__main__":
    main()
