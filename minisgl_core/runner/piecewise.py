"""Piecewise CUDA graphs for prefill and mixed steps: everything but attention, replayed.

A prefill step of a few hundred tokens runs 2-3 ms on an H100/H200 but costs 15-30 ms of host
time to launch eagerly (≈ 10 kernels per layer, each GEMM's cuBLAS heuristics for a token count
it has not seen: BENCHMARKS.md, "The host time of a serving-sized prefill step"). Its attention
cannot be captured once for all batches (the plan depends on every sequence's length), the rest
of the layer can: row-wise work on a token-major tensor.

So the model's token-major body (:meth:`hidden_states`) is captured per token count of
:func:`token_sizes`, split at every attention call (:func:`split_at_attention`): one graph up to
the first attention, one between each two, one after the last. A step pads its tokens up to the
nearest size (padding tokens sit at position 0 and write their K/V to the reserved dummy slot),
replays graph 0, runs the first layer's attention eagerly on the real tokens' rows of the fixed
buffer the graph left its inputs in, copies the result to the fixed buffer graph 1 reads, and so
on; the head (final norm and LM head of each sequence's last row) runs eagerly, since its row
count is the batch's sequence count. Equal to the eager forward up to the GEMMs' choice of
kernel for the padded row count.

Models opt in with two methods, as :class:`~minisgl_core.layers.decoder.DecoderForCausalLM` does:
``hidden_states(batch) -> tuple of token-major tensors`` (one row per new token, no row depending
on another but through attention) and ``logits_from(states, batch)``. Not part of the stable API
yet: adding it would make the API 2.1, which ends the 1.x plugins' compatibility window early.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from minisgl_core.api import AttentionBackend, ForwardBatch, Model
from minisgl_core.layers.attention import AttentionLayer, split_at_attention
from minisgl_core.runner.layout import set_layout
from minisgl_core.runner.split_mixed import SplitMixedAttention

logger = logging.getLogger(__name__)


def token_sizes(max_tokens: int) -> list[int]:
    """The token counts captured: fine steps where prompts are short, coarser above."""
    sizes = [16, 32, 64, 128, 192, 256, 384, 512, 640, 768, 896, 1024]
    sizes += list(range(1280, max_tokens + 1, 256))
    sizes = [s for s in sizes if s <= max_tokens]
    if not sizes or sizes[-1] != max_tokens:
        sizes.append(max_tokens)
    return sizes


def supports_piecewise(model: torch.nn.Module) -> bool:
    return callable(getattr(model, "hidden_states", None)) and callable(getattr(model, "logits_from", None))


@dataclass
class _Piece:
    """A graph, then the attention call that follows it (none after the last graph)."""

    graph: torch.cuda.CUDAGraph
    layer: AttentionLayer | None = None
    method: str = ""
    #: the attention's inputs as the graph leaves them, [size, ...] each
    args: tuple[torch.Tensor, ...] = ()
    #: [size, heads * head_dim]: where the attention's output goes for the next graph
    out: torch.Tensor | None = None


class PiecewiseGraphs:
    def __init__(
        self, model: Model, attn: AttentionBackend, dummy_slot: int, max_tokens: int, device: torch.device
    ) -> None:
        self.model = model
        self.attn = attn
        self.dummy_slot = dummy_slot
        self.sizes = token_sizes(max_tokens)
        self.max_tokens = self.sizes[-1]
        n = self.max_tokens
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.out_cache_loc = torch.full((n,), dummy_slot, dtype=torch.int64, device=device)
        #: flat buffers shared by every size: the attention inputs each graph ends by writing,
        #: and the attention outputs the next graph starts from (one layer's at a time)
        self._buffers: dict[tuple, torch.Tensor] = {}
        self.pieces: dict[int, list[_Piece]] = {}
        self.states: dict[int, tuple[torch.Tensor, ...]] = {}
        self._capture()

    # ------------------------------------------------------------------ capture

    def _batch(self, size: int) -> ForwardBatch:
        # What the captured body reads: token ids, positions, KV slots and the backend's
        # capabilities; attention itself never runs on this batch.
        device = self.input_ids.device
        one = torch.ones(1, dtype=torch.int32, device=device)
        return ForwardBatch(
            is_prefill=True,
            input_ids=self.input_ids[:size],
            positions=self.positions[:size],
            out_cache_loc=self.out_cache_loc[:size],
            req_slots=one * 0,
            seq_lens=one * size,
            extend_lens=one * size,
            seq_lens_cpu=[size],
            extend_lens_cpu=[size],
            page_table=torch.zeros(1, size, dtype=torch.int32, device=device),
            logits_indices=one.long() * (size - 1),
            attn=self.attn,
            captured=True,
        )

    def _buffer(self, key: tuple, numel: int, dtype: torch.dtype) -> torch.Tensor:
        buf = self._buffers.get(key)
        if buf is None:  # first met at the largest size, captured first
            buf = self._buffers[key] = torch.zeros(numel, dtype=dtype, device=self.input_ids.device)
        return buf

    def _output(self, layer: AttentionLayer, size: int, dtype: torch.dtype) -> torch.Tensor:
        width = layer.num_heads * layer.head_dim
        return self._buffer(("out", width, dtype), self.max_tokens * width, dtype)[: size * width].view(
            size, width
        )

    @torch.inference_mode()
    def _capture(self) -> None:
        start = time.perf_counter()
        torch.cuda.synchronize()
        gc.collect()  # see GraphRunner._capture
        gc.disable()
        try:
            pool = torch.cuda.graph_pool_handle()
            stream = torch.cuda.Stream()
            for size in reversed(self.sizes):  # largest first: the shared buffers get their size
                self._capture_size(size, pool, stream)
        finally:
            gc.enable()
        torch.cuda.synchronize()
        logger.info(
            "captured piecewise prefill CUDA graphs for %d token counts (%d..%d, %d graphs each) in %.1f s",
            len(self.sizes), self.sizes[0], self.sizes[-1], len(self.pieces[self.sizes[-1]]),
            time.perf_counter() - start,
        )  # fmt: skip

    def _capture_size(self, size: int, pool, stream: torch.cuda.Stream) -> None:
        batch = self._batch(size)

        def warm(layer: AttentionLayer, method: str, args: tuple[torch.Tensor, ...], _b) -> torch.Tensor:
            return self._output(layer, size, args[0].dtype)

        with split_at_attention(warm):  # lazy initialisation and autotuning outside the graphs
            self.model.hidden_states(batch)
        torch.cuda.synchronize()

        pieces: list[_Piece] = []
        current = torch.cuda.CUDAGraph()

        def split(layer: AttentionLayer, method: str, args: tuple[torch.Tensor, ...], _b) -> torch.Tensor:
            nonlocal current
            staged = []
            for i, t in enumerate(args):  # the inputs into fixed buffers, still inside the graph
                buf = self._buffer(
                    ("in", method, i, t.dtype, t[0].numel()), self.max_tokens * t[0].numel(), t.dtype
                )
                view = buf[: t.numel()].view(t.shape)
                view.copy_(t)
                staged.append(view)
            current.capture_end()
            out = self._output(layer, size, args[0].dtype)
            pieces.append(_Piece(current, layer, method, tuple(staged), out))
            current = torch.cuda.CUDAGraph()
            current.capture_begin(pool=pool)
            return out

        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), split_at_attention(split):
            current.capture_begin(pool=pool)
            try:
                states = self.model.hidden_states(batch)
            finally:
                current.capture_end()
        torch.cuda.current_stream().wait_stream(stream)
        pieces.append(_Piece(current))
        self.pieces[size] = pieces
        self.states[size] = tuple(states)

    # ------------------------------------------------------------------ replay

    def can_run(self, batch: ForwardBatch) -> bool:
        attn = batch.attn.prefill if isinstance(batch.attn, SplitMixedAttention) else batch.attn
        return attn is self.attn and batch.num_tokens <= self.max_tokens

    def prepare(self, batch: ForwardBatch) -> Callable[[], torch.Tensor]:
        """Plan the attention and fill the fixed inputs but the token ids; the call returned
        copies those in, replays the pieces with the attention between them and returns the logits."""
        n = batch.num_tokens
        size = next(s for s in self.sizes if s >= n)
        self.positions[:n].copy_(batch.positions)
        self.out_cache_loc[:n].copy_(batch.out_cache_loc)
        if size > n:
            self.positions[n:size].zero_()
            self.out_cache_loc[n:size].fill_(self.dummy_slot)
        set_layout(batch)
        batch.attn.prepare_metadata(batch)
        pieces = self.pieces[size]

        @torch.inference_mode()
        def run() -> torch.Tensor:
            self.input_ids[:n].copy_(batch.input_ids)
            if size > n:
                self.input_ids[n:size].zero_()
            for piece in pieces:
                piece.graph.replay()
                if piece.layer is not None:
                    out = getattr(piece.layer, piece.method)(*(a[:n] for a in piece.args), batch)
                    piece.out[:n].copy_(out)
            states = tuple(s[:n] for s in self.states[size])
            return self.model.logits_from(states, batch)

        return run
