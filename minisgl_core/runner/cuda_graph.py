"""CUDA graphs for decode: one graph per captured batch size, padded replays.

Decode steps are many small kernels, so launching them costs more than running them at small
batch sizes. Each captured graph reads fixed input buffers; a real batch is copied into them,
padded up to the nearest captured size with dummy requests that point at a reserved spare
page-table row and a reserved KV page, and the graph replays.

With cascade attention (the decode backend declares "cascade") every size is captured twice: a
plain graph, and a cascade graph captured on ``shared_prefixes=[]`` that replays the batches
whose ``shared_prefixes`` is set (the dummy requests are lone sequences there).
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable

import torch

from minisgl_core.api import AttentionBackend, ForwardBatch, Model, SharedPrefix
from minisgl_core.layers.triton_ops import pdl_scope
from minisgl_core.runner.layout import FastLayoutBatch, fast_layout_enabled, set_layout

logger = logging.getLogger(__name__)


#: decode graphs of at most this many sequences are captured with programmatic dependent launch
#: (``triton_ops.pdl_scope``; ``MINISGL_PDL`` set decides for every graph instead): at one sequence
#: a step is a chain of short kernels whose launch gaps it hides (on an H200 this default took 3.9%
#: off a Llama-3.1-8B fp8-head token at batch 1 and 1.6% off a bf16 one against MINISGL_PDL=0,
#: Qwen3-0.6B within its spread), while offline, where the large batches dominate, PDL everywhere
#: cost Qwen3-0.6B 1% (BENCHMARKS.md)
PDL_MAX_BS = 8


def capture_sizes(max_bs: int) -> list[int]:
    sizes = [s for s in (1, 2, 4, 8) if s <= max_bs] + list(range(16, max_bs + 1, 16))
    if sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sizes


class GraphRunner:
    # Handed the pieces it replays rather than the runner, so graphs sit below the runner.
    def __init__(
        self,
        model: Model,
        attn: AttentionBackend,
        page_table: torch.Tensor,
        dummy_slot: int,
        max_bs: int,
        cascade: bool = False,
        sequences_per_request: int = 1,
        single_gpu: bool = True,
    ) -> None:
        self.model = model
        #: the small graphs take programmatic dependent launch on one GPU only (under tensor
        #: parallelism the all-reduce kernels between the products were not measured with it)
        self.single_gpu = single_gpu
        self.page_table = page_table
        self.cascade = cascade
        self.attn = attn
        num_request_rows = page_table.shape[0]
        # A decode batch holds at most one sequence per request row (the spare row aside); a
        # speculative verify batch holds one per verified position (1 + drafts) of each request.
        self.max_bs = min(max_bs, (num_request_rows - 1) * sequences_per_request)
        self.sizes = capture_sizes(self.max_bs)
        device = page_table.device
        # The last page-table row is reserved for padding: graphs of a larger size than the batch
        # point their spare entries at it and at the dummy slot.
        self.spare_row = num_request_rows - 1
        self.dummy_slot = dummy_slot
        page_table[self.spare_row].fill_(self.dummy_slot)
        n = self.max_bs
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.out_cache_loc = torch.full((n,), self.dummy_slot, dtype=torch.int64, device=device)
        self.req_slots = torch.full((n,), self.spare_row, dtype=torch.int32, device=device)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.extend_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.logits_indices = torch.arange(n, device=device)
        self._fast_layout = fast_layout_enabled(device)
        #: by (batch size, cascade)
        self.graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, bool], torch.Tensor] = {}
        self._capture()

    def _batch(
        self, bs: int, seq_lens_cpu: list[int], shared: list[SharedPrefix] | None = None
    ) -> ForwardBatch:
        # the replay batch's layout is built on first read (FastLayoutBatch): only by a backend
        # that plans from it
        batch_type = FastLayoutBatch if self._fast_layout else ForwardBatch
        return batch_type(
            is_prefill=False,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            out_cache_loc=self.out_cache_loc[:bs],
            req_slots=self.req_slots[:bs],
            seq_lens=self.seq_lens[:bs],
            extend_lens=self.extend_lens[:bs],
            seq_lens_cpu=seq_lens_cpu,
            extend_lens_cpu=[1] * bs,
            page_table=self.page_table,
            logits_indices=self.logits_indices[:bs],
            attn=self.attn,
            captured=True,
            shared_prefixes=shared,
        )

    @torch.inference_mode()
    def _capture(self) -> None:
        start = time.perf_counter()
        self.attn.init_graph_capture(self.max_bs)
        pool = None
        torch.cuda.synchronize()
        # A garbage collection during capture could free CUDA objects of an earlier engine in
        # this process, which is illegal while the stream is capturing.
        gc.collect()
        gc.disable()
        try:
            self._capture_sizes(pool)
        finally:
            gc.enable()
        torch.cuda.synchronize()
        logger.info(
            "captured %d decode CUDA graphs (bs %d..%d%s) in %.1f s",
            len(self.graphs), self.sizes[0], self.sizes[-1], ", plain and cascade" if self.cascade else "",
            time.perf_counter() - start,
        )  # fmt: skip

    def _capture_sizes(self, pool) -> None:
        variants = (False, True) if self.cascade else (False,)
        for bs in reversed(self.sizes):  # largest first, so smaller graphs reuse its memory pool
            for cascade in variants:
                batch = self._batch(bs, [1] * bs, [] if cascade else None)
                set_layout(batch)  # its kernel compiles here, at start-up
                self.attn.prepare_capture(batch)
                with pdl_scope(bs <= PDL_MAX_BS and self.single_gpu):
                    for _ in range(2):  # warm up outside the graph (lazy init, autotuning)
                        self.model(batch)
                    torch.cuda.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool):
                        self.outputs[bs, cascade] = self.model(batch)
                pool = graph.pool()
                self.graphs[bs, cascade] = graph

    def can_run(self, batch: ForwardBatch) -> bool:
        return batch.batch_size <= self.max_bs and (batch.shared_prefixes is None or self.cascade)

    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        return self.prepare(batch)()

    def prepare(self, batch: ForwardBatch) -> Callable[[], torch.Tensor]:
        """Fill the graph's inputs but the token ids and plan its attention; the call returned
        copies the token ids in, replays the graph and returns the logits."""
        bs = batch.batch_size
        padded = next(s for s in self.sizes if s >= bs)
        self.positions[:bs].copy_(batch.positions)
        self.out_cache_loc[:bs].copy_(batch.out_cache_loc)
        self.req_slots[:bs].copy_(batch.req_slots)
        self.seq_lens[:bs].copy_(batch.seq_lens)
        if padded > bs:  # dummy requests: one token at position 0 of the spare row
            self.positions[bs:padded].zero_()
            self.out_cache_loc[bs:padded].fill_(self.dummy_slot)
            self.req_slots[bs:padded].fill_(self.spare_row)
            self.seq_lens[bs:padded].fill_(1)
        shared = batch.shared_prefixes
        replay_batch = self._batch(padded, batch.seq_lens_cpu + [1] * (padded - bs), shared)
        self.attn.prepare_replay(replay_batch)
        key = (padded, shared is not None)

        def run() -> torch.Tensor:
            self.input_ids[:bs].copy_(batch.input_ids)
            if padded > bs:
                self.input_ids[bs:padded].zero_()
            self.graphs[key].replay()
            return self.outputs[key][:bs]

        return run
