"""Decode attention on one layer, the Triton backend against FlashInfer's, in CUDA-graph replay (issue 19).

Both backends run through the attention API (``prepare_capture`` then ``attend``) on one random
paged layout, page 16, over a bf16 and a float8 e4m3 pool; 20 calls are captured in one graph and
the replay timed. TB/s counts the KV bytes the batch reads. Each Triton output is compared with
FlashInfer's on the same pool (max |difference|). A context of 0 stands for the offline
workload's spread: lengths drawn uniformly from 100 to 2,048. In bf16 the Triton kernel is also
timed with ``exact_pv`` on (P·V float32-accurate: a second product), that product's cost.

    python3 tools/device_triton_decode.py [--sweep] [--occupancy] [--tail] [--json OUT.json]

``--occupancy`` first times launches with a register cap (``Launch.maxnreg``): over a float8 pool
the kernel takes 194 registers a thread uncapped at 128 positions (two programs an SM); 168 at
128, 128 at 64 and 96 at 32 positions spill nothing (three, four, five programs), two tighter
caps that spill are timed too. ``--sweep`` first tries launch configurations of the Triton
kernel (positions per loop step, warps, pipeline stages) on the full-batch Qwen3 shapes, per pool
dtype, and reports each. ``--tail`` first times launches and split rules (``programs_per_sm``) at
the batches of an offline run's second half (8-192 sequences of 700-2,048 positions: the longest
requests are the last to finish), where a batch of 66 or fewer Qwen3 sequences splits its KV.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math

import torch

from minisgl_core.api import AttentionConfig, KVCache
from minisgl_core.plugins import Plugins
from minisgl_core.testing.paged import make_forward_batch, random_page_table

PAGE = 16
HEAD_DIM = 128
#: (query heads, KV heads, batch, context; 0 = 100..2,048): Qwen3-0.6B and Llama-3.1-8B at full
#: batch, a mid batch, long sequences, batch 1 and 4
SHAPES = [
    (16, 8, 256, 800),
    (16, 8, 256, 0),
    (32, 8, 256, 800),
    (32, 8, 256, 0),
    (16, 8, 64, 800),
    (16, 8, 32, 1500),
    (32, 8, 1, 200),
    (32, 8, 4, 1000),
]


#: ``--tail``: (query heads, KV heads, batches) at contexts TAIL_CONTEXTS
TAIL_SHAPES = [(16, 8, (8, 16, 32, 64, 96, 128, 192)), (32, 8, (32, 64, 128))]
TAIL_CONTEXTS = (700, 2048)
#: ``--tail``: launches per pool dtype (the default first) and split rules
TAIL_LAUNCHES = {
    torch.float8_e4m3fn: [(128, 4, 3, 168), (64, 4, 3, 128), (64, 4, 3, None), (32, 4, 3, 96)],
    torch.bfloat16: [(64, 4, 2, None), (32, 4, 2, None), (64, 4, 3, None), (128, 4, 2, None)],
}
TAIL_PROGRAMS_PER_SM = (4, 8)


class Problem:
    """One pool filled with random values and one random layout of ``bs`` sequences, each ``ctx``
    positions long (0: drawn from 100..2,048; a pair: drawn from that range)."""

    def __init__(self, qo: int, kv: int, bs: int, ctx: int | tuple[int, int], kv_dtype: torch.dtype,
                 dev: torch.device) -> None:  # fmt: skip
        gen = torch.Generator().manual_seed(0)
        lo, hi = ctx if isinstance(ctx, tuple) else (100, 2048)
        self.lens = (
            [ctx] * bs
            if isinstance(ctx, int) and ctx
            else torch.randint(lo, hi + 1, (bs,), generator=gen).tolist()
        )
        longest = max(self.lens)
        pages = sum(math.ceil(n / PAGE) for n in self.lens) + 4
        cache = KVCache(num_layers=1, num_pages=pages, page_size=PAGE, num_kv_heads=kv, head_dim=HEAD_DIM,
                        dtype=kv_dtype, device=dev)  # fmt: skip
        cache.buffer.copy_(torch.randn(cache.buffer.shape, generator=gen).to(kv_dtype))
        self.config = AttentionConfig(num_qo_heads=qo, num_kv_heads=kv, head_dim=HEAD_DIM, scale=HEAD_DIM**-0.5,
                                      page_size=PAGE, dtype=torch.bfloat16, device=dev, max_requests=bs + 2,
                                      max_context_len=math.ceil(longest / PAGE) * PAGE + PAGE,
                                      kv_cache=cache)  # fmt: skip
        self.layout = random_page_table(self.lens, page_size=PAGE, num_pages=pages, max_requests=bs + 2,
                                        max_context_len=self.config.max_context_len, generator=gen,
                                        device=dev)  # fmt: skip
        self.q = torch.randn(bs, qo, HEAD_DIM, generator=gen).to(device=dev, dtype=torch.bfloat16)
        self.kv_bytes = 2 * sum(self.lens) * kv * HEAD_DIM * cache.buffer.element_size()

    def replay_us(self, backend_cls, reps: int = 20) -> tuple[float, torch.Tensor]:
        backend = backend_cls(self.config)
        bs = len(self.lens)
        batch = make_forward_batch(self.layout, self.lens, [1] * bs, attn=backend, generator=torch.Generator(),
                                   is_prefill=False, captured=True)  # fmt: skip
        backend.init_graph_capture(bs)
        backend.prepare_capture(batch)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = backend.attend(self.q, 0, batch)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                out = backend.attend(self.q, 0, batch)
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e3 / (10 * reps), out.float()

    def timed_row(self, backend_cls, ref_us: float, ref: torch.Tensor, row: dict) -> dict:
        """``row`` with ``backend_cls``'s time, TB/s and distance from FlashInfer's output (``ref``,
        timed ``ref_us``), printed; an error in its place where the launch does not fit."""
        row = {**row, "fi_us": round(ref_us, 2)}
        try:
            us, out = self.replay_us(backend_cls)
            row |= {"us": round(us, 2), "tbps": round(self.kv_bytes / (us * 1e-6) / 1e12, 2),
                    "max_abs_diff_fi": float((out - ref).abs().max())}  # fmt: skip
        except Exception as e:  # a configuration that does not fit (registers, shared memory)
            row["error"] = f"{type(e).__name__}: {e}"[:160]
        print(json.dumps(row), flush=True)
        return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sweep", action="store_true")
    p.add_argument(
        "--occupancy",
        action="store_true",
        help="first time launches with a register cap (Launch.maxnreg: more programs an SM), per pool dtype",
    )
    p.add_argument(
        "--tail",
        action="store_true",
        help="first time launches and split rules at an offline run's late batches (8-192 long sequences)",
    )
    p.add_argument("--json")
    args = p.parse_args()
    dev = torch.device("cuda")
    plugins = Plugins.load()
    fi, triton_cls = plugins.resolve("attention", "fi"), plugins.resolve("attention", "triton")
    result: dict = {"device": torch.cuda.get_device_name(0), "rows": [], "sweep": []}

    if args.sweep:
        from minisgl_plugin_triton.backend import Launch

        for kv_dtype, shape in itertools.product((torch.float8_e4m3fn, torch.bfloat16), SHAPES[:2]):
            problem = Problem(*shape, kv_dtype, dev)
            size = torch.empty((), dtype=kv_dtype).element_size()
            for block_n, warps, stages in itertools.product((64, 128, 256), (4, 8), (2, 3, 4)):
                launch = Launch(block_n, warps, stages)
                variant = type("Variant", (triton_cls,), {"launches": {size: launch}})
                try:
                    us = round(problem.replay_us(variant)[0], 2)
                except Exception as e:  # a configuration that does not fit (registers, shared memory)
                    us = f"{type(e).__name__}: {e}"[:120]
                row = {"kv": str(kv_dtype)[6:], "shape": list(shape), "launch": list(launch), "us": us}
                result["sweep"].append(row)
                print(json.dumps(row), flush=True)

    if args.occupancy:
        from minisgl_plugin_triton.backend import Launch

        # the default launch of each pool dtype first, then register caps (ptxas for sm_90: float8
        # at 128 positions 194 registers uncapped; 168 / 128 / 96 at 128 / 64 / 32 positions spill
        # nothing, 128 at 128 and 96 at 64 spill 112 and 56 bytes a thread)
        plans = {
            torch.float8_e4m3fn: [(128, 4, 3, None), (128, 4, 3, 168), (64, 4, 3, None), (64, 4, 3, 128),
                                  (32, 4, 3, None), (32, 4, 3, 96), (128, 4, 3, 128), (64, 4, 3, 96)],
            torch.bfloat16: [(64, 4, 2, None), (64, 4, 2, 80), (64, 4, 3, 96), (128, 4, 3, 128)],
        }  # fmt: skip
        for kv_dtype, launches in plans.items():
            size = torch.empty((), dtype=kv_dtype).element_size()
            for shape in (SHAPES[1], SHAPES[3], SHAPES[0], SHAPES[4]):
                problem = Problem(*shape, kv_dtype, dev)
                ref_us, ref = problem.replay_us(fi)
                for launch in launches:
                    variant = type("Variant", (triton_cls,), {"launches": {size: Launch(*launch)}})
                    row = {"kv": str(kv_dtype)[6:], "shape": list(shape), "launch": list(launch)}
                    result["sweep"].append(problem.timed_row(variant, ref_us, ref, row))

    if args.tail:
        from minisgl_plugin_triton.backend import Launch, splits_for

        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        for (qo, kv, batches), (kv_dtype, launches) in itertools.product(TAIL_SHAPES, TAIL_LAUNCHES.items()):
            size = torch.empty((), dtype=kv_dtype).element_size()
            for bs in batches:
                problem = Problem(qo, kv, bs, TAIL_CONTEXTS, kv_dtype, dev)
                ref_us, ref = problem.replay_us(fi)
                for launch, per_sm in itertools.product(launches, TAIL_PROGRAMS_PER_SM):
                    attrs = {
                        "launches": {size: Launch(*launch)},
                        "programs_per_sm": per_sm,
                        "wide_launches": {},
                    }
                    variant = type("Variant", (triton_cls,), attrs)
                    row = {"kv": str(kv_dtype)[6:], "shape": [qo, kv, bs, list(TAIL_CONTEXTS)],
                           "launch": list(launch), "programs_per_sm": per_sm,
                           "splits": splits_for(bs, kv, sms, per_sm)}  # fmt: skip
                    result["sweep"].append(problem.timed_row(variant, ref_us, ref, row))

    for shape, kv_dtype in itertools.product(SHAPES, (torch.bfloat16, torch.float8_e4m3fn)):
        qo, kv, bs, ctx = shape
        problem = Problem(*shape, kv_dtype, dev)
        row: dict = {"shape": f"qo{qo}/kv{kv} bs{bs} ctx{ctx or '100-2048'}", "kv": str(kv_dtype)[6:]}
        outs = {}
        # "triton_exact_pv": the kernel with P·V float32-accurate (two products)
        exact = type("ExactPV", (triton_cls,), {"exact_pv": True})
        for name, cls in (("fi", fi), ("triton", triton_cls), ("triton_exact_pv", exact)):
            if name == "triton_exact_pv" and kv_dtype != torch.bfloat16:
                continue
            us, outs[name] = problem.replay_us(cls)
            row[f"{name}_us"] = round(us, 2)
            row[f"{name}_tbps"] = round(problem.kv_bytes / (us * 1e-6) / 1e12, 2)
        row["max_abs_diff"] = float((outs["fi"] - outs["triton"]).abs().max())
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
