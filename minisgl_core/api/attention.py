"""Attention backends and the paged KV pool they read and write."""

from __future__ import annotations

import itertools
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch

# The page layout lives next to the batch since API 2.0 (the core computes it once per batch);
# still importable from here, as in 1.x.
from minisgl_core.api.batch import ForwardBatch, HostPagedLayout, PagedLayout, paged_layout  # noqa: F401

#: the largest finite float8_e4m3fn value
_FP8_E4M3_MAX = 448.0


def _zeros_on_first_touch(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor of zeros whose memory the OS zeroes a page at a time, as each is first
    touched: ``torch.zeros`` writes every byte at once, which for the default model's pool on a
    CPU (65,536 slots, 3 GB in float32) took 1.7 s of start-up and made all of it resident from
    the start. The storage is torch's own, so ``Engine.close`` can still free it under live views."""
    buffer = torch.empty(shape, dtype=dtype)
    if not _zero_pages_on_demand(buffer.view(-1).view(torch.uint8)):
        buffer.zero_()
    return buffer


def _zero_pages_on_demand(data: torch.Tensor) -> bool:
    """Linux: the whole pages under ``data`` (a contiguous CPU byte tensor, private anonymous
    memory as every allocation of torch's is) handed back with ``madvise(MADV_DONTNEED)``, which
    makes the next touch of each a fresh zero page; the part pages at either end zeroed here.
    False, with nothing zeroed, where that is not available or ``data`` spans no whole page."""
    if sys.platform != "linux":
        return False
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    start = data.data_ptr()
    first, last = -(-start // page) * page, (start + data.numel()) // page * page
    if last <= first:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), 4) != 0:  # 4: MADV_DONTNEED
        return False
    data[: first - start].zero_()
    data[last - start :].zero_()
    return True


class KVCache:
    """The paged KV pool of one TP rank: per layer, K and V of shape
    ``[num_pages, page_size, num_kv_heads, head_dim]`` (the "NHD" paged layout)."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self.num_layers = num_layers
        self.num_pages = num_pages
        self.page_size = page_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (num_layers, 2, num_pages, page_size, num_kv_heads, head_dim)
        if self.device.type == "cpu":
            self.buffer = _zeros_on_first_touch(shape, dtype)
        else:
            self.buffer = torch.zeros(shape, dtype=dtype, device=self.device)
        # each layer's K and V views made once: indexing the buffer costs a few µs of host time,
        # and eager (prefill) steps ask for them several times per layer
        self._views = [(layer[0], layer[1]) for layer in self.buffer]

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    def k_cache(self, layer_id: int) -> torch.Tensor:
        return self._views[layer_id][0]

    def v_cache(self, layer_id: int) -> torch.Tensor:
        return self._views[layer_id][1]

    def store(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write ``k``/``v`` ([num_tokens, num_kv_heads, head_dim]) at slots ``loc``.

        One kernel when each token's v heads follow its k heads in memory (as
        :func:`~minisgl_core.layers.fused.qkv_norm_rope` leaves them), else one per tensor."""
        kv = self._adjacent(k, v)
        if kv is not None:
            # [2, slots, heads, head_dim]: k and v of one layer, written through one index
            self.buffer[layer_id].view(2, self.num_slots, self.num_kv_heads, self.head_dim)[:, loc] = kv
            return
        flat_shape = (self.num_slots, self.num_kv_heads, self.head_dim)
        self.k_cache(layer_id).view(flat_shape)[loc] = self._cast(k)
        self.v_cache(layer_id).view(flat_shape)[loc] = self._cast(v)

    def _cast(self, t: torch.Tensor) -> torch.Tensor:
        if self.dtype == torch.float8_e4m3fn:  # --kv-cache-dtype fp8_e4m3, scale 1.0: saturate, not NaN
            return t.clamp(-_FP8_E4M3_MAX, _FP8_E4M3_MAX).to(self.dtype)
        return t.to(self.dtype)

    def _adjacent(self, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor | None:
        """``k`` and ``v`` as one ``[2, num_tokens, heads, head_dim]`` view when ``v`` starts where
        ``k``'s heads end, in every token row of the same storage; None otherwise."""
        heads_size = self.num_kv_heads * self.head_dim
        if (
            k.dtype != self.dtype
            or v.dtype != self.dtype
            or k.shape != v.shape
            or k.stride() != v.stride()
            or k.stride()[1:] != (self.head_dim, 1)
            or k.untyped_storage().data_ptr() != v.untyped_storage().data_ptr()
            or v.storage_offset() - k.storage_offset() != heads_size
        ):
            return None
        shape = (2, k.shape[0], self.num_kv_heads, self.head_dim)
        return k.as_strided(shape, (heads_size, k.stride(0), self.head_dim, 1))

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class AttentionConfig:
    """What a backend is built with (head counts are per TP rank)."""

    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    page_size: int
    dtype: torch.dtype
    device: torch.device
    #: rows of the page table = most requests in flight at once
    max_requests: int
    max_context_len: int
    kv_cache: KVCache
    #: most sequences (query rows of one token) a decode step can hold, the size of any
    #: per-sequence buffer a backend keeps: ``max_requests`` times the positions a speculative
    #: verify step checks for each request (1 + draft tokens), ``max_requests`` without
    #: speculation; 0 (the default) is filled in as ``max_requests`` (API 2.2)
    max_sequences: int = 0
    #: attention logit soft-capping, ``cap * tanh(scores / cap)`` on the scaled scores before the
    #: mask and softmax (Gemma 2's ``attn_logit_softcapping``); 0.0 (the default): none. Non-zero
    #: only for backends declaring "soft_cap": the core refuses the others at start (API 2.6)
    logits_soft_cap: float = 0.0
    #: sliding-window attention (API 2.7): in the layers ``window_layers`` a query at position
    #: ``p`` attends only to the keys at positions ``p - sliding_window + 1`` to ``p``, the other
    #: layers attending causally as ever; 0 (the default): every layer attends causally. Non-zero
    #: only for backends declaring "sliding_window": the core refuses the others at start
    sliding_window: int = 0
    window_layers: frozenset[int] = frozenset()

    def window_of(self, layer_id: int) -> int:
        """The sliding window layer ``layer_id`` attends through; 0: none, causal attention."""
        return self.sliding_window if layer_id in self.window_layers else 0

    def __post_init__(self) -> None:
        if self.sliding_window < 0:
            raise ValueError(f"sliding_window must be 0 (none) or positive; got {self.sliding_window}")
        if self.max_sequences < self.max_requests:
            if self.max_sequences:
                raise ValueError(
                    f"max_sequences {self.max_sequences} is below max_requests {self.max_requests}: "
                    "a decode step holds one sequence per request at least"
                )
            object.__setattr__(self, "max_sequences", self.max_requests)


class PageRanges(NamedTuple):
    """Pages covering chosen position ranges of chosen page-table rows (see :func:`paged_ranges`)."""

    #: [total_pages] int32 page ids on the page table's device, range after range
    kv_indices: torch.Tensor
    #: [n + 1] host offsets into ``kv_indices``
    kv_indptr: list[int]
    #: [n] host: tokens used in each range's last page (0 for an empty range)
    kv_last_page_len: list[int]


def paged_ranges(
    page_table: torch.Tensor, rows: torch.Tensor, starts: list[int], ends: list[int], page_size: int
) -> PageRanges:
    """The pages of positions ``[starts[i], ends[i])`` of page-table row ``rows[i]``, for each ``i``.

    ``rows``: [n] integer tensor on the page table's device; ``starts`` must sit on page
    boundaries. Lengths come from the host lists, so nothing here waits for the device."""
    if any(s % page_size for s in starts):
        raise ValueError(f"range starts must be multiples of the page size {page_size}: {starts}")
    first = [s // page_size for s in starts]
    counts = [max(0, -(-e // page_size) - f) for e, f in zip(ends, first, strict=True)]
    indptr = [0, *itertools.accumulate(counts)]
    device = page_table.device
    info = torch.tensor([first, counts], dtype=torch.int64).to(device, non_blocking=True)
    total = indptr[-1]
    entry = torch.repeat_interleave(torch.arange(len(counts), device=device), info[1], output_size=total)
    entry_start = torch.cumsum(info[1], 0) - info[1]
    page = info[0][entry] + torch.arange(total, device=device) - entry_start[entry]
    kv_indices = (page_table[rows.long()[entry], page * page_size] // page_size).to(torch.int32)
    last = [(e - 1) % page_size + 1 if c else 0 for e, c in zip(ends, counts, strict=True)]
    return PageRanges(kv_indices, indptr, last)


class AttentionBackend(ABC):
    """Paged attention for one model. One instance serves every layer.

    The core calls :meth:`prepare_metadata` once per step, then every attention layer calls
    :meth:`forward`. Decode batches may run inside CUDA graphs: a backend that supports it sets
    ``capabilities`` to include ``"cuda_graph"`` and implements the three graph methods.
    """

    #: capability names the conformance kit and the core look at:
    #: "prefill", "decode", "cuda_graph", "page_size>1", and (API 1.3) "cascade": decode batches
    #: may carry ``ForwardBatch.shared_prefixes`` (also in CUDA graphs, when "cuda_graph" is
    #: declared: the core captures a second set of decode graphs with ``shared_prefixes=[]``),
    #: and (API 1.5) "prestored_kv": the backend implements :meth:`attend`, which the core's
    #: decoder calls instead of :meth:`forward` when it has written the K/V itself (one fused
    #: kernel on CUDA), (API 2.0) "kv_fp8": the backend reads a float8_e4m3fn KV pool
    #: (``--kv-cache-dtype fp8_e4m3``, scale 1.0) with queries in the run dtype, and (API 2.0)
    #: "mixed": prefill batches (``is_prefill``) may hold decode rows, sequences with one new
    #: token after a long KV, among the prompt chunks; the core then runs chunked prefill and the
    #: running decodes in one step (``--disable-mixed-batch`` off). A backend's prefill path
    #: normally handles them already (an extend of length 1), and (API 2.6) "soft_cap": the
    #: backend applies ``config.logits_soft_cap`` when it is non-zero (a model whose attention
    #: caps its scores, Gemma 2, runs only on backends declaring it), and (API 2.7)
    #: "sliding_window": the backend applies ``config.sliding_window`` in ``config.window_layers``
    #: (:meth:`AttentionConfig.window_of`; a model with a window shorter than the context runs
    #: only on backends declaring it)
    capabilities: ClassVar[frozenset[str]] = frozenset({"prefill", "decode", "page_size>1"})

    def __init__(self, config: AttentionConfig) -> None:
        """A backend that cannot serve ``config`` (its head size, the pool's dtype on this device)
        raises ``ValueError`` saying why; the core reports it as a one-line error at start."""
        self.config = config

    @classmethod
    def availability(cls, device: torch.device) -> str | None:
        """``None`` when the backend can run on ``device``, else one line saying why not.

        Must be cheap and must not initialise CUDA kernels."""
        return None

    @abstractmethod
    def prepare_metadata(self, batch: ForwardBatch) -> None:
        """Compute whatever the kernels need for this batch and store it in ``batch.attn_metadata``.

        The CSR page layout is already there, computed once by the core (API 2.0):
        ``batch.layout`` on the device, ``batch.host_layout`` on the host."""

    @abstractmethod
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: ForwardBatch
    ) -> torch.Tensor:
        """Store ``k``/``v`` of the new tokens at ``batch.out_cache_loc`` in ``config.kv_cache``,
        then return causal attention of ``q`` over each sequence's whole KV.

        ``q``: [num_tokens, num_qo_heads, head_dim]; ``k``/``v``: [num_tokens, num_kv_heads, head_dim].
        Returns [num_tokens, num_qo_heads, head_dim] in ``q``'s dtype."""

    def attend(self, q: torch.Tensor, layer_id: int, batch: ForwardBatch) -> torch.Tensor:
        """(API 1.5, backends declaring "prestored_kv") :meth:`forward` without the store: the
        new tokens' K/V are already at ``batch.out_cache_loc`` in ``config.kv_cache``."""
        raise NotImplementedError(f"{type(self).__name__} does not declare prestored_kv")

    # --- CUDA graphs (decode only); only called when "cuda_graph" is in capabilities ---

    def init_graph_capture(self, max_batch_size: int) -> None:
        """Allocate the fixed buffers that captured decode graphs will read."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    def prepare_capture(self, batch: ForwardBatch) -> None:
        """Like :meth:`prepare_metadata`, for a dummy batch of a captured size, using the fixed buffers."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    def prepare_replay(self, batch: ForwardBatch) -> None:
        """Refresh the fixed buffers for a real (padded) batch before the graph of its size replays."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")
