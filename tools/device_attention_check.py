"""GPU checks of the fi and fa3 attention backends: first-use JIT times, then kernel timings and
accuracy against a float64 reference. Run on the GPU machine (see ../shared/device/README.md):

    python tools/device_attention_check.py jit     # compile every kernel the GPU test suites use
    python tools/device_attention_check.py bench   # decode / prefill timings, JSON on stdout

``jit`` builds each (backend, head_dim) in its own process, all at once (FlashInfer's file locks
make concurrent builds safe), so the suites that follow find every kernel compiled. Its times
are wall times of concurrent builds, i.e. upper bounds of what each takes alone.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

import torch

from minisgl_core.api import AttentionBackend, AttentionConfig, KVCache, paged_layout
from minisgl_core.testing.paged import (
    make_forward_batch,
    random_page_table,
    reference_attention,
    store_prefixes,
)

BACKENDS = {
    "fi": "minisgl_plugin_fi.backend:FlashInferBackend",
    "fa3": "minisgl_plugin_fa3.backend:FlashAttention3Backend",
}
DTYPE = torch.bfloat16
DEVICE = "cuda"


def backend_class(name: str) -> type[AttentionBackend]:
    module, _, attribute = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), attribute)


class Case:
    """One backend over a 1-layer pool holding ``seq_lens`` sequences; the step adds ``extend_lens``."""

    def __init__(
        self,
        name: str,
        seq_lens: Sequence[int],
        extend_lens: Sequence[int],
        *,
        qo_heads: int,
        kv_heads: int,
        head_dim: int,
        page_size: int,
    ) -> None:
        gen = torch.Generator().manual_seed(0)
        pages = sum(math.ceil(n / page_size) for n in seq_lens) + 1
        max_len = math.ceil(max(seq_lens) / page_size) * page_size
        cache = KVCache(
            num_layers=1,
            num_pages=pages,
            page_size=page_size,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            dtype=DTYPE,
            device=DEVICE,
        )
        self.config = AttentionConfig(
            num_qo_heads=qo_heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            scale=head_dim**-0.5,
            page_size=page_size,
            dtype=DTYPE,
            device=torch.device(DEVICE),
            max_requests=len(seq_lens),
            max_context_len=max_len,
            kv_cache=cache,
        )
        self.backend = backend_class(name)(self.config)
        layout = random_page_table(
            seq_lens,
            page_size=page_size,
            num_pages=pages,
            max_requests=len(seq_lens),
            max_context_len=max_len,
            generator=gen,
            device=DEVICE,
        )
        self.batch = make_forward_batch(layout, seq_lens, extend_lens, attn=self.backend, generator=gen)
        self.keys = [torch.randn(n, kv_heads, head_dim, generator=gen).to(DEVICE, DTYPE) for n in seq_lens]
        self.values = [torch.randn(n, kv_heads, head_dim, generator=gen).to(DEVICE, DTYPE) for n in seq_lens]
        store_prefixes(cache, 0, self.batch, self.keys, self.values)
        pieces = zip(self.batch.prefix_lens_cpu, seq_lens, strict=True)
        self.k = torch.cat([key[p:s] for key, (p, s) in zip(self.keys, pieces, strict=True)])
        pieces = zip(self.batch.prefix_lens_cpu, seq_lens, strict=True)
        self.v = torch.cat([value[p:s] for value, (p, s) in zip(self.values, pieces, strict=True)])
        self.q = torch.randn(self.batch.num_tokens, qo_heads, head_dim, generator=gen).to(DEVICE, DTYPE)

    def step(self) -> torch.Tensor:
        return self.backend.forward(self.q, self.k, self.v, 0, self.batch)

    def relative_error(self) -> float:
        self.backend.prepare_metadata(self.batch)
        out = self.step().double().cpu()
        ref = reference_attention(
            self.q, self.keys, self.values, self.batch.extend_lens_cpu, self.config.scale
        )
        return float((out - ref).norm() / ref.norm())

    def kv_bytes(self) -> int:
        """K and V bytes the step has to read (every token of every sequence once)."""
        c = self.config
        return 2 * sum(self.batch.seq_lens_cpu) * c.num_kv_heads * c.head_dim * DTYPE.itemsize


def cuda_time_us(fn: Callable[[], object], iters: int = 200) -> float:
    for _ in range(10):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / iters


def host_time_us(fn: Callable[[], object], iters: int = 50) -> float:
    fn()
    torch.cuda.synchronize()
    begin = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - begin) * 1e6 / iters


def metadata_breakdown_us(case: Case) -> dict[str, float]:
    """Host time of one decode step's prepare_metadata, of paged_layout alone, and of a plan()
    fed paged_layout's device offsets instead of host ones (FlashInfer then syncs to read them)."""
    backend, batch, config = case.backend, case.batch, case.config
    layout = paged_layout(batch, config.page_size)

    def plan_from_device_offsets() -> None:
        backend.decode_wrappers[0].plan(
            layout.kv_indptr,
            layout.kv_indices,
            layout.kv_last_page_len,
            config.num_qo_heads,
            config.num_kv_heads,
            config.head_dim,
            config.page_size,
            **backend._kernel_options(),
        )

    return {
        "decode_prepare_metadata_us": round(host_time_us(lambda: backend.prepare_metadata(batch)), 1),
        "decode_paged_layout_us": round(host_time_us(lambda: paged_layout(batch, config.page_size)), 1),
        "decode_plan_from_device_offsets_us": round(host_time_us(plan_from_device_offsets), 1),
    }


def graph_time_us(case: Case) -> float:
    """One decode layer captured in a CUDA graph, replayed."""
    backend, batch = case.backend, case.batch
    backend.init_graph_capture(batch.batch_size)
    backend.prepare_capture(batch)
    case.step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        case.step()
    backend.prepare_replay(batch)
    return cuda_time_us(graph.replay)


def warm(name: str, head_dim: int) -> dict[str, float]:
    """First prefill and first decode of one backend and head_dim: includes the JIT build."""
    times = {}
    for phase, extend in (("prefill_s", [40, 7]), ("decode_s", [1, 1])):
        case = Case(name, [40, 23], extend, qo_heads=8, kv_heads=2, head_dim=head_dim, page_size=16)
        torch.cuda.synchronize()
        begin = time.perf_counter()
        case.backend.prepare_metadata(case.batch)
        case.step()
        torch.cuda.synchronize()
        times[phase] = round(time.perf_counter() - begin, 2)
    return times


def jit(head_dims: Sequence[int]) -> None:
    jobs = {
        (name, dim): subprocess.Popen(
            [sys.executable, __file__, "warm", name, str(dim)], stdout=subprocess.PIPE, text=True
        )
        for name in BACKENDS
        for dim in head_dims
    }
    begin = time.perf_counter()
    for (name, dim), job in jobs.items():
        out, _ = job.communicate()
        print(f"jit {name} head_dim={dim}: {out.strip()} (rc {job.returncode})", flush=True)
    print(
        f"jit: all {len(jobs)} builds done in {time.perf_counter() - begin:.1f} s (concurrently)", flush=True
    )


def bench() -> None:
    shape = {"qo_heads": 32, "kv_heads": 8, "head_dim": 128}
    results = []
    for name in BACKENDS:
        for page_size in (1, 16):
            decode = Case(name, [1024] * 64, [1] * 64, page_size=page_size, **shape)
            host_us = metadata_breakdown_us(decode)
            decode.backend.prepare_metadata(decode.batch)
            eager_us = cuda_time_us(decode.step)
            prefill = Case(name, [1024] * 8, [256] * 8, page_size=page_size, **shape)
            prefill.backend.prepare_metadata(prefill.batch)
            prefill_us = cuda_time_us(prefill.step)
            row = {
                "backend": name,
                "page_size": page_size,
                "decode_bs64_ctx1024_us_per_layer": round(eager_us, 1),
                "decode_graph_us_per_layer": round(graph_time_us(decode), 1),
                "decode_kv_TBps": round(decode.kv_bytes() / eager_us / 1e6, 2),
                **host_us,
                "decode_rel_err": decode.relative_error(),
                "prefill_8x256_on_1024_us_per_layer": round(prefill_us, 1),
                "prefill_TFLOPs": round(4 * 8 * 256 * (768 + 128.5) * 32 * 128 / prefill_us / 1e6, 1),
                "prefill_rel_err": prefill.relative_error(),
            }
            results.append(row)
            print(json.dumps(row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("jit").add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    warm_parser = sub.add_parser("warm")
    warm_parser.add_argument("backend", choices=sorted(BACKENDS))
    warm_parser.add_argument("head_dim", type=int)
    sub.add_parser("bench")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", file=sys.stderr)
    if args.command == "jit":
        jit(args.head_dims)
    elif args.command == "warm":
        print(json.dumps(warm(args.backend, args.head_dim)))
    else:
        bench()


if __name__ == "__main__":
    main()
